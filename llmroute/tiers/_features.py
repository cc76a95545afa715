"""What the classifier sees of a request: capped user text, its embedding, n-grams, structure.

A request body is reduced to one float32 vector of three blocks:

- ``embedding``: wordllama's shipped 256-d static embedding (``l2_supercat_256``) of the user
  text, mean-pooled over tokens and unit length; the text is capped (head and tail) first, so a
  long prompt costs no more than a short one;
- ``ngrams``: hashed character 1-, 2- and 3-grams of the case-folded, capped user text, log
  counts, unit length: they work for any script (Chinese, Japanese, mixed), where the Llama-2
  tokenizer of the embedding splits CJK text badly;
- ``structure``: cheap counts (lengths and turns of the whole body; code fences, math marks,
  digits, lines and questions of the capped user text; tools, ``response_format``, images,
  ``max_tokens``), unscaled here; the model standardises them.

The caps (600 characters embedded, 2,000 hashed) keep a decision under 1 ms at p99 on a 2-core
machine for any prompt (benchmarks/tiers.py); the tokenizer costs about 0.3 us a character.
The embedding loads lazily (:func:`load_embedding`) and never downloads: it is read from the
installed ``wordllama`` package's own folder.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..routing.windows import MAX_TOKENS_CAP  # its log stays finite
from ._errors import TiersError, unavailable

__all__ = [
    "STRUCTURE_NAMES",
    "FeatureSpec",
    "RequestText",
    "capped",
    "load_embedding",
    "ngram_vector",
    "request_text",
]

EMBEDDING_DIM = 256
WORDLLAMA_CONFIG = "l2_supercat"

STRUCTURE_NAMES: tuple[str, ...] = (
    "log_user_chars",
    "log_last_user_chars",
    "log_system_chars",
    "log_assistant_chars",
    "log_messages",
    "log_user_turns",
    "log_code_fences",
    "log_backticks",
    "log_math_marks",
    "digit_share",
    "non_ascii_share",
    "log_lines",
    "log_questions",
    "has_tools",
    "log_tools",
    "has_response_format",
    "log_images",
    "has_max_tokens",
    "log_max_tokens",
)


_MATH_MARKS = ("$", "\\frac", "\\sum", "\\int", "^", "=", "∑", "∫", "√", "≤", "≥", "π", "∞")


@dataclass(frozen=True, slots=True)
class FeatureSpec:
    """How a body becomes a vector; saved with a classifier so it is rebuilt the same way."""

    ngram_dim: int = 1024
    embedding: bool = True
    embed_chars: int = 600
    ngram_chars: int = 2000

    def __post_init__(self) -> None:
        if self.ngram_dim < 16 or self.ngram_dim & (self.ngram_dim - 1):
            raise TiersError(f"ngram_dim must be a power of two >= 16, got {self.ngram_dim}")
        if self.embed_chars < 16 or self.ngram_chars < 16:
            raise TiersError("embed_chars and ngram_chars must be at least 16")

    @property
    def dim(self) -> int:
        return (EMBEDDING_DIM if self.embedding else 0) + self.ngram_dim + len(STRUCTURE_NAMES)

    @property
    def structure_slice(self) -> slice:
        return slice(self.dim - len(STRUCTURE_NAMES), self.dim)

    def vector(self, body: Mapping[str, Any]) -> np.ndarray:
        """The feature vector of one request body (float32, length :attr:`dim`)."""
        text = request_text(body, max(self.embed_chars, self.ngram_chars, KEEP_CHARS))
        parts: list[np.ndarray] = []
        if self.embedding:
            parts.append(embed(capped(text.user, self.embed_chars)))
        head_tail = capped(text.user, self.ngram_chars)
        codes = _code_points(head_tail)
        parts.append(ngram_vector(codes, self.ngram_dim))
        parts.append(_structure(text, head_tail, codes))
        return np.concatenate(parts)

    def matrix(self, bodies: Sequence[Mapping[str, Any]]) -> np.ndarray:
        out = np.empty((len(bodies), self.dim), dtype=np.float32)
        for row, body in enumerate(bodies):
            out[row] = self.vector(body)
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "ngram_dim": self.ngram_dim,
            "embedding": self.embedding,
            "embed_chars": self.embed_chars,
            "ngram_chars": self.ngram_chars,
            "structure": list(STRUCTURE_NAMES),
            "embedding_model": f"wordllama/{WORDLLAMA_CONFIG}_{EMBEDDING_DIM}",
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FeatureSpec:
        if list(data.get("structure", [])) != list(STRUCTURE_NAMES):
            raise TiersError("its structure features differ from this llmroute's; fit it again")
        return cls(
            ngram_dim=int(data["ngram_dim"]),
            embedding=bool(data["embedding"]),
            embed_chars=int(data["embed_chars"]),
            ngram_chars=int(data["ngram_chars"]),
        )


INSPECT = 256
"""Of a body's messages, and of a message's content parts, at most this many from each end are
read: a crafted body of a million tiny parts costs no more than one of 512 (the rest are only
counted, ``len`` of the list)."""

PARTS_BUDGET = 4 * INSPECT
"""Content parts read in one body, over all its messages (the newest message's first)."""

KEEP_CHARS = 4096
"""Of the user text, at most this many characters from each end are kept (the caps of
:class:`FeatureSpec` must fit in it); the rest is never joined or copied."""


@dataclass(slots=True)
class RequestText:
    """The parts of a request the features read: the user text's head and tail (whole when it
    fits in ``2 * keep`` characters) and counts over the messages and parts read (at most
    :data:`INSPECT` from each end of each list; ``messages`` counts every message)."""

    user: str = ""
    user_chars: int = 0
    last_user_chars: int = 0
    system_chars: int = 0
    assistant_chars: int = 0
    messages: int = 0
    user_turns: int = 0
    images: int = 0
    tools: int = 0
    response_format: bool = False
    max_tokens: int | None = None


def request_text(body: Mapping[str, Any], keep: int = KEEP_CHARS) -> RequestText:
    """The user text (every user turn, oldest first, joined by newlines; only its first and last
    ``keep`` characters when longer) and counts of an OpenAI chat body, or of a Responses
    body's ``input``; unknown shapes count as empty rather than fail. The work is bounded
    whatever the body: at most :data:`INSPECT` messages and parts from each end are read, and
    no more than ``keep`` characters from each end of the text are copied."""
    out = RequestText()
    users: list[list[str]] = []  # each user turn's text pieces (their "\n" joins implied)
    messages = body.get("messages")
    if messages is None:
        messages = body.get("input")
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        instructions = body.get("instructions")
        if isinstance(instructions, str):
            out.system_chars += len(instructions)
    if isinstance(messages, list):
        out.messages += max(len(messages) - 2 * INSPECT, 0)  # counted, not read
        window = _ends(messages)
        budget = [PARTS_BUDGET]
        read: dict[int, list[str]] = {}
        for index in (len(window) - 1, *range(len(window) - 1)):  # the newest turn first
            message = window[index] if index >= 0 else None
            if isinstance(message, Mapping):
                read[index] = _content_pieces(message.get("content"), out, budget)
        for index, message in enumerate(window):
            if not isinstance(message, Mapping):
                continue
            role = message.get("role", "user" if "content" in message else None)
            if role is None:
                continue
            out.messages += 1
            pieces = read[index]
            size = sum(map(len, pieces)) + max(len(pieces) - 1, 0)
            if role == "user":
                users.append(pieces)
                out.user_turns += 1
                out.last_user_chars = size
            elif role in ("system", "developer"):
                out.system_chars += size
            else:
                out.assistant_chars += size
    out.user, out.user_chars = _head_and_tail(users, keep)
    tools = body.get("tools") or body.get("functions")
    if isinstance(tools, list):
        out.tools = len(tools)
    fmt = body.get("response_format")
    if fmt is None:
        fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    out.response_format = isinstance(fmt, Mapping) and fmt.get("type") not in (None, "text")
    for key in ("max_completion_tokens", "max_tokens", "max_output_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool):
            out.max_tokens = min(max(value, 0), MAX_TOKENS_CAP)  # a negative one is 0, not NaN
            break
    return out


def _ends(items: list[Any], each: int = INSPECT) -> list[Any]:
    """``items`` whole, or its first and last ``each`` (a copy of references only)."""
    if len(items) <= 2 * each:
        return items
    return items[:each] + items[len(items) - each :] if each > 0 else []


def _content_pieces(content: object, out: RequestText, budget: list[int]) -> list[str]:
    """A message's text pieces (a string, or the text parts of its first and last
    :data:`INSPECT` parts, fewer once the body's ``budget`` of parts is spent); images among
    those parts are counted on ``out``."""
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        return []
    parts = _ends(content, min(INSPECT, budget[0] // 2))
    budget[0] -= len(parts)
    texts: list[str] = []
    for part in parts:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, Mapping):
            kind = part.get("type")
            text = part.get("text")
            if isinstance(text, str):
                texts.append(text)
            elif kind in ("image_url", "input_image", "image"):
                out.images += 1
    return texts


def _head_and_tail(turns: list[list[str]], keep: int) -> tuple[str, int]:
    """The turns' pieces joined by newlines — whole when that is at most ``2 * keep``
    characters, else only its first ``keep`` and last ``keep`` characters, copied from the
    ends (no piece in between is touched) — and the whole join's length."""
    pieces = [piece for turn in turns for piece in (*turn, "\n")][:-1] if turns else []
    total = sum(map(len, pieces))
    if total <= 2 * keep:
        return "".join(pieces), total
    return _take(pieces, keep) + _take(pieces[::-1], keep, tail=True), total


def _take(pieces: list[str], keep: int, *, tail: bool = False) -> str:
    """The first ``keep`` characters of ``pieces`` joined (``tail``: ``pieces`` are given last
    first, and the last ``keep`` characters come back in order)."""
    taken: list[str] = []
    left = keep
    for piece in pieces:
        if left <= 0:
            break
        cut = (
            piece if len(piece) <= left else (piece[len(piece) - left :] if tail else piece[:left])
        )
        taken.append(cut)
        left -= len(cut)
    return "".join(taken[::-1] if tail else taken)


def capped(text: str, limit: int) -> str:
    """``text`` whole when it fits in ``limit`` characters, else its head (a third) and its tail
    (the rest): a long prompt is never read whole, and its latest words are kept."""
    if len(text) <= limit:
        return text
    head = limit // 3
    return text[:head] + "\n" + text[len(text) - (limit - head - 1) :]


def _code_points(text: str) -> np.ndarray:
    return np.frombuffer(text.casefold().encode("utf-32-le"), dtype=np.uint32).astype(np.uint64)


# Odd 64-bit multipliers: each n-gram length hashes with its own, so a 1-gram and a 2-gram do
# not collide by construction.
_MIX = np.uint64(0x9E3779B97F4A7C15)
_SALTS = (
    np.uint64(0xC2B2AE3D27D4EB4F),
    np.uint64(0x165667B19E3779F9),
    np.uint64(0x27D4EB2F165667C5),
)


def ngram_vector(codes: np.ndarray, dim: int) -> np.ndarray:
    """Hashed character 1-3-gram log counts of ``codes`` (code points), unit length (float32)."""
    out = np.zeros(dim, dtype=np.float32)
    n = codes.shape[0]
    if n == 0:
        return out
    shift = np.uint64(64 - (dim.bit_length() - 1))
    grams = [codes]
    if n >= 2:
        grams.append(codes[:-1] * _MIX + codes[1:])
    if n >= 3:
        grams.append(grams[1][:-1] * _MIX + codes[2:])
    with np.errstate(over="ignore"):
        index = np.concatenate(
            [(g * salt) >> shift for g, salt in zip(grams, _SALTS, strict=False)]
        )
    counts = np.bincount(index.astype(np.intp), minlength=dim).astype(np.float32)
    np.log1p(counts, out=out)
    norm = float(np.linalg.norm(out))
    if norm > 0:
        out /= norm
    return out


def _structure(text: RequestText, user: str, codes: np.ndarray) -> np.ndarray:
    n = max(codes.shape[0], 1)
    digits = int(np.count_nonzero((codes >= 48) & (codes <= 57)))
    non_ascii = int(np.count_nonzero(codes > 127))
    math = sum(user.count(mark) for mark in _MATH_MARKS)
    values = (
        np.log1p(text.user_chars),
        np.log1p(text.last_user_chars),
        np.log1p(text.system_chars),
        np.log1p(text.assistant_chars),
        np.log1p(text.messages),
        np.log1p(text.user_turns),
        np.log1p(user.count("```") // 2 + user.count("~~~") // 2),
        np.log1p(user.count("`")),
        np.log1p(math),
        digits / n,
        non_ascii / n,
        np.log1p(user.count("\n")),
        np.log1p(user.count("?") + user.count("\uff1f")),
        float(text.tools > 0),
        np.log1p(text.tools),
        float(text.response_format),
        np.log1p(text.images),
        float(text.max_tokens is not None),
        np.log1p(text.max_tokens or 0) / 10.0,
    )
    return np.asarray(values, dtype=np.float32)


# -- the embedding: wordllama, loaded once per process, never downloaded ---------------------

_lock = threading.Lock()
_embedding: tuple[Any, np.ndarray] | None = None


def load_embedding() -> tuple[Any, np.ndarray]:
    """wordllama's tokenizer and embedding matrix, loaded on first call (then shared).

    Reads the two files shipped inside the installed ``wordllama`` package (its safetensors
    weights and its tokenizer), without importing the package itself (which imports an HTTP
    client and every model config) and without any download. A wordllama whose files are laid
    out otherwise is loaded by its own ``WordLlama.load`` pointed at its folder, downloads
    disabled (its defaults would look for a ``tokenizer/`` folder the wheel does not have and
    try to download it). Raises :class:`TiersUnavailable` naming the extra when it is missing.
    """
    global _embedding
    if _embedding is not None:
        return _embedding
    with _lock:
        if _embedding is None:
            _embedding = _read_wordllama()
    return _embedding


def _read_wordllama() -> tuple[Any, np.ndarray]:
    import importlib.util

    try:
        spec = importlib.util.find_spec("wordllama")
    except ValueError:  # a stand-in module without a spec (sys.modules["wordllama"] = None)
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise unavailable("wordllama")
    folder = Path(next(iter(spec.submodule_search_locations))).resolve()
    weights = folder / "weights" / f"{WORDLLAMA_CONFIG}_{EMBEDDING_DIM}.safetensors"
    vocabulary = folder / "tokenizers" / f"{WORDLLAMA_CONFIG}_tokenizer_config.json"
    try:
        from safetensors import safe_open
        from tokenizers import Tokenizer
    except ImportError:
        raise unavailable("wordllama") from None
    try:
        if weights.is_file() and vocabulary.is_file():
            tokenizer = Tokenizer.from_file(str(vocabulary))
            with safe_open(str(weights), framework="np") as f:
                matrix = f.get_tensor("embedding.weight")
        else:
            from wordllama import WordLlama

            model = WordLlama.load(
                config=WORDLLAMA_CONFIG,
                dim=EMBEDDING_DIM,
                cache_dir=folder,
                disable_download=True,
            )
            tokenizer, matrix = model.tokenizer, model.embedding
    except ImportError:
        raise unavailable("wordllama") from None
    except Exception as exc:
        raise TiersError(
            f"wordllama's shipped model could not be loaded from {folder}: {exc}"
        ) from None
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer, np.ascontiguousarray(matrix, dtype=np.float32)


def embed(text: str) -> np.ndarray:
    """The unit-length mean of ``text``'s token embeddings (zeros for an empty text)."""
    tokenizer, matrix = load_embedding()
    if not text:
        return np.zeros(matrix.shape[1], dtype=np.float32)
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    if not ids:
        return np.zeros(matrix.shape[1], dtype=np.float32)
    index = np.asarray(ids, dtype=np.intp)
    np.clip(index, 0, matrix.shape[0] - 1, out=index)
    vector = matrix[index].mean(axis=0)
    norm = float(np.linalg.norm(vector))
    return vector / norm if norm > 0 else vector
