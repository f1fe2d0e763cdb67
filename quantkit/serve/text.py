"""Text around the serving engine: the checkpoint's tokenizer, chat templates, incremental
detokenization with stop strings, and GPT-OSS's Harmony output channels.

- Prompts are encoded as the checkpoint's tokenizer does with special tokens (the BOS a Llama-style
  ``add_bos_token`` asks for included, :func:`quantkit.tokenizer.bos_id`); a rendered chat is
  encoded without adding any, since the template writes them (vLLM's rule).
- Chat templates are the checkpoint's own Jinja (``tokenizer_config.json``'s ``chat_template`` or
  ``chat_template.jinja``), rendered in a sandbox with transformers' extras (``raise_exception``,
  ``strftime_now``, ``tojson``, ``trim_blocks``/``lstrip_blocks``).  GPT-OSS's template writes Harmony.
- :class:`Detokenizer` turns tokens into text incrementally as vLLM does (prefix and read offsets, so a
  character split over several byte-level tokens appears once it is whole) and ends the text before
  the first stop string; while streaming it holds back as many characters as a stop string could
  still claim.
- :func:`split_harmony` separates a GPT-OSS reply's ``analysis`` channel (reasoning) from its
  ``final`` answer.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path

from .. import families

# what render_chat itself gives a chat template: a request's chat_template_kwargs cannot set these
TEMPLATE_VARIABLES = ("messages", "add_generation_prompt", "bos_token", "eos_token")
HARMONY_MARKERS = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|return|>", "<|call|>", "<|constrain|>", "<|endoftext|>")


class Detokenizer:
    def __init__(self, tokenizer, skip_special_tokens: bool = True, stop: tuple[str, ...] = (), include_stop_str: bool = False,
                 pieces: dict[int, str] | None = None) -> None:
        """``pieces``: single tokens decoded with these settings, shared by a tokenizer's detokenizers
        (:meth:`ModelText.detokenizer`): the text before a new token is most often its previous token's."""
        self.tok, self.skip = tokenizer, skip_special_tokens
        self.stop, self.include_stop = tuple(stop), include_stop_str
        self.hold = max((len(s) for s in self.stop), default=1) - 1
        self.pieces = {} if pieces is None else pieces
        self.ids: list[int] = []
        self.text = ""
        self._prefix = self._read = 0
        self._before: str | None = None  # ids[_prefix:_read] decoded, once known
        self._sent = 0
        self.final = self.stopped = False

    def add(self, token: int, check_stop: bool = True) -> str | None:
        """Append one token; the stop string it completed, if any (the text then ends before it).
        ``check_stop`` False (before ``min_tokens``): no stop string is looked for in this token's text."""
        ids = self.ids
        ids.append(token)
        before = self._before
        if before is None:
            before = self._before = self.tok.decode(ids[self._prefix:self._read], skip_special_tokens=self.skip)
        now = self.tok.decode(ids[self._prefix:], skip_special_tokens=self.skip)
        if len(now) <= len(before) or now.endswith("\ufffd"):
            return None  # an incomplete character: wait for the rest of its bytes
        old = len(self.text)
        self.text += now[len(before):]
        self._prefix, self._read = self._read, len(ids)
        self._before = self._piece(token) if self._read - self._prefix == 1 else None
        if not self.stop or not check_stop:
            return None
        start = max(0, old - self.hold)
        found = [(i, s) for s in self.stop if (i := self.text.find(s, start)) >= 0]
        if not found:
            return None
        i, s = min(found)
        self.text = self.text[: i + (len(s) if self.include_stop else 0)]
        self.stopped = True
        return s

    def _piece(self, token: int) -> str:
        text = self.pieces.get(token)
        if text is None:
            text = self.pieces[token] = self.tok.decode([token], skip_special_tokens=self.skip)
        return text

    def finish(self) -> None:
        """The request ended: bytes still waiting for the rest of a character are decoded as they are
        (U+FFFD), as decoding all the tokens at once gives them; not after a stop string."""
        if not self.stopped and self._read < len(self.ids):
            before = self.tok.decode(self.ids[self._prefix:self._read], skip_special_tokens=self.skip)
            now = self.tok.decode(self.ids[self._prefix:], skip_special_tokens=self.skip)
            self.text += now[len(before):]
            self._prefix = self._read = len(self.ids)
            self._before = None
        self.final = True

    def delta(self) -> str:
        """Text not sent yet that no stop string can still take back."""
        limit = len(self.text) if self.final else len(self.text) - self.hold
        if limit <= self._sent:
            return ""
        out, self._sent = self.text[self._sent:limit], limit
        return out


_HARMONY_MSG = re.compile(r"(?:<\|start\|>assistant)?<\|channel\|>([^<]*?)(?:<\|constrain\|>[^<]*)?<\|message\|>(.*?)(?=<\|end\|>|<\|return\|>|<\|call\|>|<\|start\|>|$)",
                          re.S)


def split_harmony(text: str) -> tuple[str, str]:
    """(reasoning, content) of a GPT-OSS reply decoded with its special tokens kept: the ``analysis``
    channel's messages, and the others' (``final``, ``commentary``).  A reply with no channel header is all
    content, markers removed."""
    msgs = _HARMONY_MSG.findall(text)
    if not msgs:
        if "<|channel|>" in text:  # a header still arriving
            return "", ""
        for m in HARMONY_MARKERS:
            text = text.replace(m, "")
        return "", text
    reasoning = "".join(body for ch, body in msgs if ch.strip().split(" ")[0] == "analysis")
    content = "".join(body for ch, body in msgs if ch.strip().split(" ")[0] != "analysis")
    return reasoning, content


PIECE = 1 << 16  # characters encoded at once while counting a long text's tokens


def check_length(tok, text: str, limit: int | None) -> None:
    """Raise ValueError when ``text`` has more than ``limit`` tokens, without encoding it whole: an encoding
    costs about 200 bytes a token, so an 8 MB prompt encoded at once took 0.9 GB before any cap could look
    at it.  A text of at most limit / 2 UTF-8 bytes passes at once (the byte-level BPE tokenizers of these
    families make at most one token of a byte: twice that leaves room); a longer one is counted in pieces of PIECE characters cut before a space (where a
    byte-level BPE pre-tokenizer cuts anyway), or anywhere in a run without one."""
    if limit is None or len(text) * 8 <= limit or len(text.encode("utf-8", "surrogatepass")) * 2 <= limit:
        return
    count, i = 0, 0
    while i < len(text):
        j = text.find(" ", i + PIECE, i + 2 * PIECE)
        j = min(len(text), i + PIECE) if j < 0 else j
        count += len(tok.encode(text[i:j], add_special_tokens=False).ids)
        if count > limit:
            raise ValueError(f"the prompt has more than {limit} tokens, this server's limit per request")
        i = j


class ModelText:
    """A checkpoint's tokenizer, chat template and end-of-sequence ids."""

    def __init__(self, ckpt: str | Path, config: dict) -> None:
        from tokenizers import Tokenizer

        from ..tokenizer import bos_id

        self.root = Path(ckpt)
        self.family = families.detect(config, str(self.root / "config.json")).name
        tok_path = self.root / "tokenizer.json"
        self.tok = Tokenizer.from_file(str(tok_path)) if tok_path.exists() else None
        cfg_path = self.root / "tokenizer_config.json"
        self.tok_config = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}
        self.bos = bos_id(self.root, self.tok) if self.tok is not None else None
        template = self.tok_config.get("chat_template")
        if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        jinja_path = self.root / "chat_template.jinja"
        if template is None and jinja_path.exists():
            template = jinja_path.read_text(encoding="utf-8")
        self.chat_template = template
        self.eos_ids = self._eos_ids(config)
        # per skip_special_tokens: single tokens decoded, shared by the detokenizers (at most the vocabulary)
        self.pieces: dict[bool, dict[int, str]] = {}

    @property
    def harmony(self) -> bool:
        return self.family == "gpt-oss"

    def _special(self, name: str) -> str | None:
        v = self.tok_config.get(name)
        return v.get("content") if isinstance(v, dict) else v

    def _eos_ids(self, config: dict) -> tuple[int, ...]:
        ids: list[int] = []
        gen_path = self.root / "generation_config.json"
        for src in (json.loads(gen_path.read_text()) if gen_path.exists() else {}, config):
            v = src.get("eos_token_id")
            ids += [v] if isinstance(v, int) else list(v or [])
        eos = self._special("eos_token")
        if eos is not None and self.tok is not None and self.tok.token_to_id(eos) is not None:
            ids.append(self.tok.token_to_id(eos))
        return tuple(dict.fromkeys(ids))

    def _need_tokenizer(self, what: str):
        if self.tok is None:
            raise ValueError(f"{self.root} has no tokenizer.json: {what} needs one (send token ids instead)")
        return self.tok

    def encode(self, text: str, add_special_tokens: bool = True, limit: int | None = None) -> list[int]:
        """A text prompt's ids; ``add_special_tokens`` False: without the BOS (and whatever else the tokenizer's
        post-processor adds), as lm-eval's remote tokenizer asks for pieces of a prompt.  ``limit``: refuse
        (ValueError) a text of more tokens, counted in bounded pieces first (:func:`check_length`)."""
        tok = self._need_tokenizer("a text prompt")
        check_length(tok, text, limit)
        ids = tok.encode(text, add_special_tokens=add_special_tokens).ids
        if add_special_tokens and self.bos is not None and (not ids or ids[0] != self.bos):
            ids = [self.bos, *ids]
        return ids

    def tokenizer_info(self, max_model_len: int) -> dict:
        """vLLM's ``/tokenizer_info``: the special tokens and the chat template (lm-eval's remote tokenizer reads them)."""
        self._need_tokenizer("/tokenizer_info")
        info = {k: v for k, v in self.tok_config.items() if isinstance(v, (str, int, float, bool)) and k != "chat_template"}
        info.update({f"{name}_token": self._special(f"{name}_token") for name in ("bos", "eos", "pad", "unk")})
        return {**info, "tokenizer_class": self.tok_config.get("tokenizer_class", "PreTrainedTokenizerFast"),
                "chat_template": self.chat_template, "model_max_length": max_model_len, "vocab_size": self.tok.get_vocab_size()}

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True, **extra) -> str:
        if self.chat_template is None:
            raise ValueError(f"{self.root} has no chat template (tokenizer_config.json chat_template or chat_template.jinja)")
        from jinja2.exceptions import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str):
            raise TemplateError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.filters["tojson"] = lambda x, indent=None, ensure_ascii=False: json.dumps(x, indent=indent, ensure_ascii=ensure_ascii)
        env.globals.update(raise_exception=raise_exception, strftime_now=lambda fmt: datetime.now().strftime(fmt))
        try:
            return env.from_string(self.chat_template).render(
                messages=messages, add_generation_prompt=add_generation_prompt, bos_token=self._special("bos_token") or "",
                eos_token=self._special("eos_token") or "", **extra)
        except TemplateError as e:
            raise ValueError(f"the chat template of {self.root} refused the messages: {e}") from None

    def encode_chat(self, messages: list[dict], limit: int | None = None, **extra) -> list[int]:
        tok, text = self._need_tokenizer("a chat"), self.render_chat(messages, **extra)
        check_length(tok, text, limit)
        return tok.encode(text, add_special_tokens=False).ids

    def detokenizer(self, stop: tuple[str, ...] = (), include_stop_str: bool = False, skip_special_tokens: bool = True) -> Detokenizer | None:
        if self.tok is None:
            if stop:
                raise ValueError(f"stop strings need a tokenizer, and {self.root} has no tokenizer.json")
            return None
        return Detokenizer(self.tok, skip_special_tokens, stop, include_stop_str,
                           self.pieces.setdefault(skip_special_tokens, {}))

    def token_str(self, token: int) -> str:
        """One token as text (special tokens kept), or ``token_id:N`` without a tokenizer."""
        if self.tok is None:
            return f"token_id:{token}"
        return self.tok.decode([token], skip_special_tokens=False)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._need_tokenizer("text output").decode(ids, skip_special_tokens=skip_special_tokens)
