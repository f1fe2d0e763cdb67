"""One module per CLI command; each imports heavy modules inside the command function."""
