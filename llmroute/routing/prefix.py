"""Prefix affinity: which target most likely still holds a prompt's prefix in its cache.

Self-hosted servers (SGLang's RadixAttention) and vendors with prompt caching answer sooner
when they have seen a prompt's leading part recently. The client cannot see their caches, so it
keeps an approximate copy of each: the prefixes of the requests it sent there lately.

The approximation, like SGLang's gateway but over fixed-size blocks instead of characters:

- A request's messages are rendered to one string (role, text, a fingerprint of each non-text
  part and of tool calls), cut into blocks of ``block_chars`` characters (64, about 16 tokens),
  and each block is named by a *chain hash*: the hash of the previous block's name and the
  block's text. A name thus stands for the whole prefix up to and including its block, and a
  set of names is a radix tree over blocks (each node keyed by its path).
- Each target's :class:`PrefixTree` holds at most ``max_blocks`` names. An insert touches a
  prompt's blocks deepest first, so a prefix is always at least as recent as anything that
  extends it and least-recently-used eviction drops leaves before the prefixes they share, as
  a radix cache does. A discard (a planned request another target served) takes out only the
  blocks that one insert added and no other insert touched since, so it never removes a
  prefix something still held extends. The blocks a tree holds for any prompt are therefore a
  leading run, and a match is a binary search: O(log n) lookups.
- Two prompts match up to their last common whole block: up to ``block_chars - 1`` common
  characters are not counted, a trailing partial block matches only an identical prompt, and
  prompts longer than ``max_blocks`` blocks are matched on their first ``max_blocks``. The
  share of a prompt a match covers is counted in characters (:attr:`Prompt.chars`), so a short
  trailing partial block weighs what its few characters weigh, not a whole block.
- A server caches the prompt *and* the answer it generated, and the next turn of a chat sends
  both back: :meth:`Prompt.extend` names the blocks of the prompt followed by more rendered
  messages (the answer as an assistant message) without rendering the prompt again.
- Names use Python's ``hash`` (64 bits, salted per process): the trees live in one process, and
  a collision (about n² / 2⁶⁴) would at worst misplace one request.
- Request fields outside ``messages`` (``tools``, ``response_format``) are not part of a prefix.

A prefix that many conversations start with (a system prompt every user gets) says nothing of
where one conversation lives: every target ends up holding it. :class:`CommonPrefixes` counts,
for the prefixes the traffic shares, how many of the conversations started lately went through
them, so that a policy can discount the part of a match that is common to more than an even
share of them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = [
    "COMMON_HALF_LIFE",
    "COMMON_MIN_CONVERSATIONS",
    "DEFAULT_BLOCK_CHARS",
    "DEFAULT_MAX_BLOCKS",
    "CommonPrefixes",
    "PrefixIndex",
    "PrefixTree",
    "Prompt",
    "prompt_blocks",
    "render_prompt",
]

DEFAULT_BLOCK_CHARS = 64
"""Characters per block: about 16 tokens of English text."""
DEFAULT_MAX_BLOCKS = 16384
"""Blocks remembered per target: about 1M characters (256k tokens) of prefixes, some 2 MB."""

COMMON_HALF_LIFE = 256.0
"""Conversations after which a conversation's weight in :class:`CommonPrefixes` halves: the
shares are those of the last few hundred conversations started."""
COMMON_MIN_CONVERSATIONS = 4
"""A prefix is common only once at least this many of the recent conversations (decayed) share it:
two or three chats of one user, or a chat edited twice, are not yet "the traffic"."""

_MASK = (1 << 64) - 1
_ABSENT: Any = object()
_EXTRA_FIELDS = ("name", "tool_calls", "tool_call_id", "function_call")


def _fingerprint(value: object) -> str:
    try:
        text = repr(value)
    except (RecursionError, ValueError):  # nested too deeply, an int of over 4300 digits
        text = f"<{type(value).__name__} beyond repr>"
    return f"\x1d{hash(text) & _MASK:016x}"


def render_prompt(messages: Iterable[Mapping[str, Any]]) -> str:
    """The messages as one string whose prefixes are the prompt's prefixes.

    Text is kept as is; an image or other non-text part, and a message's tool calls or name,
    become a short fingerprint (so a long image costs no more than a few characters).
    """
    parts: list[str] = []
    append = parts.append
    for message in messages:
        if not isinstance(message, Mapping):  # not a message: only the request's own business
            append(_fingerprint(message))
            append("\x1e")
            continue
        role = message.get("role", "")
        append(role if isinstance(role, str) else _fingerprint(role))
        append("\x1f")
        content = message.get("content")
        if isinstance(content, str):
            append(content)
        elif isinstance(content, list | tuple):
            for part in content:
                if isinstance(part, Mapping) and part.get("type") == "text":
                    text = part.get("text")
                    append(text if isinstance(text, str) else _fingerprint(text))
                else:
                    append(_fingerprint(part))
        elif content is not None:
            append(_fingerprint(content))
        for key in _EXTRA_FIELDS:
            value = message.get(key)
            if value:
                append(_fingerprint((key, value)))
        append("\x1e")
    return "".join(parts)


def _chain(text: str, block_chars: int, count: int, name: int) -> list[int]:
    """The chain hashes of the first ``count`` blocks of ``text``, following the name ``name``."""
    end = min(len(text), block_chars * count)
    names: list[int] = []
    append = names.append
    for start in range(0, end, block_chars):
        name = hash((name, text[start : start + block_chars]))
        append(name)
    return names


class Prompt:
    """A rendered prompt's block names, with what is needed to extend it.

    ``blocks`` are the chain hashes (at most ``max_blocks``), ``chars`` the characters they
    cover (the rendered text, up to ``block_chars * max_blocks``) and ``tail`` the text of a
    trailing partial block (empty when the text ends on a block boundary or was cut).
    """

    __slots__ = ("block_chars", "blocks", "chars", "max_blocks", "tail")

    def __init__(
        self,
        text: str,
        block_chars: int = DEFAULT_BLOCK_CHARS,
        max_blocks: int = DEFAULT_MAX_BLOCKS,
        *,
        _start: tuple[int, ...] = (),
    ) -> None:
        if block_chars < 1 or max_blocks < 0:
            raise ValueError("block_chars must be at least 1 and max_blocks not negative")
        self.block_chars = block_chars
        self.max_blocks = max_blocks
        name = _start[-1] if _start else block_chars
        names = _chain(text, block_chars, max_blocks - len(_start), name)
        self.blocks: tuple[int, ...] = (*_start, *names)
        self.chars = min(len(_start) * block_chars + len(text), block_chars * max_blocks)
        cut = self.chars % block_chars
        self.tail = text[len(text) - cut :] if cut else ""

    @classmethod
    def of(
        cls,
        messages: Iterable[Mapping[str, Any]],
        block_chars: int = DEFAULT_BLOCK_CHARS,
        max_blocks: int = DEFAULT_MAX_BLOCKS,
    ) -> Prompt:
        """The prompt of these chat messages."""
        return cls(render_prompt(messages), block_chars, max_blocks)

    def share(self, matched: int, after: int = 0) -> float:
        """The share of the prompt's characters in its first ``matched`` blocks (0 to 1), or,
        with ``after``, the share of those beyond its first ``after`` blocks that blocks
        ``after`` to ``matched`` hold."""
        rest = self.chars - after * self.block_chars
        if rest <= 0 or matched <= after:
            return 0.0
        if matched >= len(self.blocks):
            return 1.0
        return (matched - after) * self.block_chars / rest

    def extend(self, messages: Iterable[Mapping[str, Any]]) -> Prompt:
        """This prompt followed by ``messages``: the blocks of the prompt the next turn of a
        chat starts with. Only the trailing partial block and the new text are hashed."""
        whole = len(self.blocks) - (1 if self.tail else 0)
        return Prompt(
            self.tail + render_prompt(messages),
            self.block_chars,
            self.max_blocks,
            _start=self.blocks[:whole],
        )


def prompt_blocks(
    messages: Iterable[Mapping[str, Any]],
    block_chars: int = DEFAULT_BLOCK_CHARS,
    max_blocks: int = DEFAULT_MAX_BLOCKS,
) -> tuple[int, ...]:
    """The chain hashes of the rendered prompt's blocks, at most ``max_blocks`` of them.

    Two prompts share their first ``k`` names exactly when their first ``k`` whole blocks are
    the same text.
    """
    if block_chars < 1 or max_blocks < 0:
        raise ValueError("block_chars must be at least 1 and max_blocks not negative")
    return tuple(_chain(render_prompt(messages), block_chars, max_blocks, block_chars))


class PrefixTree:
    """The prompt prefixes one target was sent lately: at most ``max_blocks`` block names,
    the least recently used dropped first (leaves before the prefixes they extend).

    Each name remembers which insert added it (its ``owner``) until another insert touches it;
    :meth:`discard` takes back only the names an owner still holds alone.
    """

    __slots__ = ("_blocks", "max_blocks")

    def __init__(self, max_blocks: int = DEFAULT_MAX_BLOCKS) -> None:
        if max_blocks < 1:
            raise ValueError(f"max_blocks must be at least 1, got {max_blocks!r}")
        self.max_blocks = max_blocks
        self._blocks: OrderedDict[int, int | None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block: int) -> bool:
        return block in self._blocks

    def match(self, blocks: Sequence[int]) -> int:
        """How many leading blocks of a prompt (from :func:`prompt_blocks`) the tree holds."""
        held = self._blocks
        if not blocks or blocks[0] not in held:
            return 0
        if blocks[-1] in held:
            return len(blocks)
        low, high = 1, len(blocks) - 1  # blocks[:low] are held, blocks[high] is not
        while low < high:
            middle = (low + high) // 2
            if blocks[middle] in held:
                low = middle + 1
            else:
                high = middle
        return low

    def insert(self, blocks: Sequence[int], owner: int | None = None) -> None:
        """Remember a prompt sent to this target (all its blocks become the most recent).

        The blocks it adds belong to ``owner`` (``None``: to nobody, they stay) until another
        insert touches them; the blocks it touches belong to nobody from now on.
        """
        held = self._blocks
        touch, get = held.move_to_end, held.get
        for block in reversed(blocks):  # deepest first: the shared prefix ends up the newest
            was = get(block, _ABSENT)
            if was is _ABSENT:
                held[block] = owner
            else:
                if was is not None:
                    held[block] = None
                touch(block)
        for _ in range(len(held) - self.max_blocks):
            held.popitem(last=False)

    def discard(self, blocks: Iterable[int], owner: int) -> None:
        """Forget the blocks of a prompt the target did not serve after all: those the insert
        of ``owner`` added and no other insert touched since. Another prompt extending one of
        them touched it, so no block that stays is left without its prefix."""
        held = self._blocks
        for block in blocks:
            if held.get(block) == owner:  # an int: never a block held by nobody (None)
                del held[block]

    def clear(self) -> None:
        self._blocks.clear()


class PrefixIndex:
    """The :class:`PrefixTree` of every target of a route, each created on first use."""

    __slots__ = ("_trees", "max_blocks")

    def __init__(self, max_blocks: int = DEFAULT_MAX_BLOCKS) -> None:
        if max_blocks < 1:
            raise ValueError(f"max_blocks must be at least 1, got {max_blocks!r}")
        self.max_blocks = max_blocks
        self._trees: dict[str, PrefixTree] = {}

    def tree(self, target: str) -> PrefixTree:
        tree = self._trees.get(target)
        if tree is None:
            tree = self._trees[target] = PrefixTree(self.max_blocks)
        return tree

    def sizes(self) -> dict[str, int]:
        """Blocks held per target."""
        return {name: len(tree) for name, tree in self._trees.items()}


class CommonPrefixes:
    """How many of the conversations started lately share each prefix of the traffic.

    A request is the next turn of a known conversation when the longest prefix any target holds
    for it ends where an earlier request of that conversation (or its answer) ended; otherwise it
    starts a conversation, which counts once on every block it shares with earlier traffic. The
    counts decay by half every :data:`COMMON_HALF_LIFE` conversations, so they describe the
    recent traffic. Counting costs a few dictionary updates per block a *new* conversation
    shares (a system prompt's blocks), nothing per block of a conversation's own history, and
    at most ``max_blocks`` names are kept (least recently counted dropped first).

    :meth:`depth` then says how far a prompt's prefix is common: shared by more than a given
    share of the recent conversations and by at least :data:`COMMON_MIN_CONVERSATIONS`.
    """

    __slots__ = ("_counts", "_ends", "_started", "conversations", "half_life", "max_blocks")

    def __init__(
        self, max_blocks: int = DEFAULT_MAX_BLOCKS, half_life: float = COMMON_HALF_LIFE
    ) -> None:
        if max_blocks < 1 or not half_life > 0:
            raise ValueError("max_blocks must be at least 1 and half_life positive")
        self.max_blocks = max_blocks
        self.half_life = half_life
        self.conversations = 0.0
        """The conversations started lately (decayed, as the counts are)."""
        self._started = 0  # conversations started, ever: the clock of the decay
        self._counts: OrderedDict[int, tuple[float, int]] = OrderedDict()
        # where each conversation ends now: after its last answer (True) or request (False)
        self._ends: OrderedDict[int, bool] = OrderedDict()

    def count(self, block: int) -> float:
        """The recent conversations (decayed) whose prompts went through this block: 1 for a
        block only one conversation had (or that is no longer counted)."""
        entry = self._counts.get(block)
        if entry is None:
            return 1.0
        value, at = entry
        value *= 0.5 ** ((self._started - at) / self.half_life)
        return min(value, self.conversations)  # its first conversation was counted as new

    def depth(self, blocks: Sequence[int], held: int, share: float) -> int:
        """How many leading ``blocks`` (at most ``held``) more than ``share`` of the recent
        conversations, and at least :data:`COMMON_MIN_CONVERSATIONS`, share."""
        need = max(float(COMMON_MIN_CONVERSATIONS), share * self.conversations)
        counted = self._counts
        low, high = 0, min(held, len(blocks))  # counts only fall along a prompt's blocks
        while low < high:
            middle = (low + high + 1) // 2
            block = blocks[middle - 1]
            if block in counted and self.count(block) > need:
                low = middle
            else:
                high = middle - 1
        return low

    def record(self, prompt: Prompt, held: int) -> None:
        """A request's prompt, of which some target holds the first ``held`` blocks: the next
        turn of the conversation that ended there, or a new conversation through them.

        It is the next turn when the blocks held end where a conversation's last answer did,
        or where its last request did and the prompt adds whole blocks of its own (a prompt
        that adds only a partial block after another's could be a new chat with a short
        question, after a system prompt that filled the blocks before it)."""
        blocks, ends, whole = prompt.blocks, self._ends, _whole(prompt)
        if held >= len(blocks) or not whole:  # the same prompt again, or a very short one
            return
        held = min(held, whole)
        end = blocks[held - 1] if held else 0
        answered = ends.get(end) if held else None
        if answered or (answered is not None and whole > held):
            del ends[end]
        else:
            self._started += 1
            self.conversations = self.conversations * 0.5 ** (1 / self.half_life) + 1
            counts, now = self._counts, self._started
            for block in blocks[:held]:
                counts[block] = (self.count(block) + 1, now)
                counts.move_to_end(block)
            for _ in range(len(counts) - self.max_blocks):
                counts.popitem(last=False)
        self._end(blocks[whole - 1], answered=False)

    def answered(self, prompt: Prompt, answer: Prompt) -> None:
        """The answer to ``prompt`` completed: its conversation now ends where ``answer`` (the
        prompt followed by the answer) does."""
        asked, whole = _whole(prompt), _whole(answer)
        if asked:
            self._ends.pop(prompt.blocks[asked - 1], None)
        if whole:  # an answer that filled no block of its own ends where the request did
            self._end(answer.blocks[whole - 1], answered=whole > asked)

    def _end(self, block: int, *, answered: bool) -> None:
        ends = self._ends
        ends[block] = answered
        ends.move_to_end(block)
        for _ in range(len(ends) - self.max_blocks):
            ends.popitem(last=False)


def _whole(prompt: Prompt) -> int:
    """The prompt's whole blocks (a trailing partial block changes when the prompt grows)."""
    return len(prompt.blocks) - (1 if prompt.tail else 0)
