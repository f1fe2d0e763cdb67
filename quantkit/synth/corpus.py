"""Training text for the synthetic tokenizers (written for this purpose): mixed prose, chat, code,
numbers and a few non-English lines, so the byte-level BPE learns ordinary word pieces."""

CORPUS = """\
The quick brown fox jumps over the lazy dog. A synthetic checkpoint has random weights, but its
tokenizer still has to turn text into ids and ids back into the same text, special tokens included.
Quantization maps each weight to a small set of values: a block of 32 shares one power-of-two scale
in MXFP4 and MXFP8, and a tile of 128 by 128 shares one float scale in the FP8 block format.
Experts are routed per token; the router picks the top four (or eight) of them and mixes their
outputs with softmax or sigmoid weights. Attention keeps a cache of keys and values for each layer.
Numbers like 0, 1, 12, 123, 1234 and 12345 are split in groups of at most three digits.
User: What is the capital of France? Assistant: The capital of France is Paris.
User: Can you write a short poem about the sea? Assistant: Waves fold over waves, the grey sea
breathes in and out, and the gulls write their names on the wind before the evening comes.
User: How many minutes are there in a day? Assistant: There are 24 hours in a day and 60 minutes in
an hour, so there are 1440 minutes in a day.
User: Summarize the meeting notes. Assistant: The team agreed to ship the release on Friday, to
measure the latency of the new server first, and to write the documentation before the demo.
A language model reads a sequence of tokens and predicts the next one. During training it sees
billions of examples; during inference it generates text one token at a time, sampling from the
probability distribution it computes over the whole vocabulary. Temperature makes the distribution
sharper or flatter; top-p keeps the smallest set of tokens whose probabilities add up to p.
The history of computing is a history of layers: transistors make gates, gates make adders and
memories, those make processors, and processors run operating systems, compilers and programs.
Good software is small, tested and documented. Each function does one thing, each module has one
reason to change, and every error message says what went wrong and how to fix it.
In the morning the market opens at nine, the bakery sells fresh bread, and the children walk to
school while the buses and the bicycles share the narrow streets of the old town.
Mathematics: (a + b) * c = a * c + b * c; x[i] += y[j] - z / 2 % 7 & 0xFF | ~mask ^ bits >> 3 << 1.
The integral of x squared from 0 to 1 is one third, and the sum of the first n odd numbers is n^2.
def forward(self, x):
    return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))

class Cache:
    def __init__(self, layers: int, heads: int, dim: int) -> None:
        self.keys = [None] * layers
        self.values = [None] * layers

for i in range(10):
    print(i * 2 + 1, "items", 3.14159, 2025, 128, 4096, 7168)
if __name__ == "__main__":
    main()
{"name": "weights", "shape": [4096, 7168], "dtype": "float8_e4m3fn", "scale": 0.0125}
SELECT name, count(*) FROM tokens WHERE length > 3 GROUP BY name ORDER BY count DESC LIMIT 10;
https://example.com/path/to/file.html?query=value&page=2 user@example.com 2024-06-01 12:30:45
Il fait beau aujourd'hui et nous allons au marché. Das ist ein kleiner Test mit Umlauten: äöü ß.
Esto es una prueba de tokenización con acentos: canción, niño, corazón. Questo è un esempio.
これはテストです。日本語の文章も少し入れておきます。这是一个测试，我们也加入一些中文句子。
Привет, мир! Это короткое предложение на русском языке. 안녕하세요, 반갑습니다.
Emoji and symbols: 🙂 🚀 ✓ → ← ≤ ≥ ± × ÷ € £ ¥ © ® ™ § ¶ • … “quoted” ‘single’ — dash.
"""
