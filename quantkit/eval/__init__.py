"""Accuracy of converted checkpoints: reference runners, engine candidates, llama.cpp KLD metrics, reports."""
