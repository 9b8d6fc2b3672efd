"""The ``prefix`` routing profile: send a prompt where its longest prefix was sent before,
unless that replica is loaded, and check each guess against what the engine reused.

Blocks. A prompt (a chat's messages in order, or a completion's prompt) is cut into
blocks, each named by a hash chained over every block before it (Python's own string
hash: each gateway's table is its own), so a block matches only
where the whole prefix up to it matches (vLLM's and the sim's prefix caches name their
blocks the same way). A chat message starts a new block (its own boundary: a
conversation that resends its history resends the same messages), and a long text is
cut every ``BLOCK_CHARS`` characters. Only the first ``MAX_BLOCKS`` blocks count: past
them a prompt is hashed no further (bounded work for any body).

The table (``PrefixTable``). Per replica, the blocks sent there recently, least recently
used forgotten first, at most ``BLOCKS_PER_REPLICA`` each; an index from a block to the
replicas holding it makes the scoring one look-up per block, whatever the number of
replicas.

The choice (``choose``). A replica whose in-flight requests (per unit of weight) exceed
the least loaded one's by more than ``BALANCE`` is not chosen for its cache: a hot
prefix spills to the next replica instead of queueing on one (the failure of
sgl-project/sglang#21199, where a cache-aware router sent a hot prefix's traffic to one
overloaded replica). Among the others: the longest cached prefix, when it covers the
rendezvous key's blocks (a chat's first message and the first block of its
second; a completion's first ``RENDEZVOUS_BLOCKS``); a tie, a shorter prefix (a system
prompt many replicas hold) or a prefix seen nowhere goes by a rendezvous hash of those
blocks, so every gateway sends a conversation to the same replica without talking to
the others, whatever part of the traffic each has seen.

The check (``PrefixTable.check``). The engine says what it reused (vLLM and the sim:
``usage.prompt_tokens_details.cached_tokens``; llama.cpp: ``timings.cache_n``). A guess
of ``p`` cached tokens answered with fewer than half of ``p`` means the engine evicted
what the table still held: the block it lacked is forgotten, with every block sent to
that replica before it was last sent there (the engine evicts least recently used
first, so those are gone too).
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.table import Replica

# A long text is cut every this many characters (about 128 tokens of English): a 4k-token
# prompt is about 32 blocks, hashed and looked up in tens of microseconds.
BLOCK_CHARS = 512
# Blocks hashed per prompt at most (256 x 512 characters, about 32k tokens).
MAX_BLOCKS = 256
# Blocks remembered per replica (least recently used forgotten first): about 8M
# characters of prompts, 2M tokens; a block costs about 150 bytes (its LRU entry and its
# index entry), so about 2.5 MB per replica.
BLOCKS_PER_REPLICA = 16384
# A replica more than this many in-flight requests (per unit of weight) above the least
# loaded one is not chosen for its cache.
BALANCE = 2.0
# A completion prompt's leading blocks that key the rendezvous choice (a chat's are its
# first message and the first block of its second): the first 512 characters, which in
# a trace of conversations (mooncake's) already name the conversation.
RENDEZVOUS_BLOCKS = 1
# A guess answered with less than this share of it is a miss (the engine evicted).
MISS_BELOW = 0.5

_MASK = (1 << 64) - 1


@dataclass(slots=True)  # (not frozen: made on every request, frozen costs 4x)
class Prompt:
    """A prompt's blocks: their chained hashes, and the characters up to each one's end."""

    blocks: tuple[int, ...]
    ends: tuple[int, ...]
    chars: int
    key: int  # the rendezvous key: a stable hash of the first block of each key message
    key_blocks: int  # how many leading blocks the key covers


def _texts(body: Mapping[str, Any], kind: str) -> list[str] | None:
    if kind == "chat":
        messages = body.get("messages")
        if not isinstance(messages, list):
            return None
        out = []
        for m in messages:
            if not isinstance(m, dict):
                continue
            content = m.get("content")
            role = m.get("role")
            head = f"{role}\x1f" if isinstance(role, str) else "\x1f"
            if isinstance(content, str):
                out.append(head + content)
            elif isinstance(content, list):
                parts = [
                    p["text"]
                    for p in content
                    if isinstance(p, dict) and isinstance(p.get("text"), str)
                ]
                out.append(head + "\x1e".join(parts))
            else:
                out.append(head)
        return out
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return [prompt]
    return None


def prompt_of(body: Mapping[str, Any], kind: str) -> Prompt | None:
    """The blocks of a request's prompt; None for one with no text to key on (token ids,
    embeddings)."""
    texts = _texts(body, kind)
    if not texts:
        return None
    blocks: list[int] = []
    ends: list[int] = []
    head: list[str] = []  # the key's first block of each of its messages
    key_blocks = 0
    chars = 0
    h = 0
    for m, text in enumerate(texts):
        for start in range(0, max(len(text), 1), BLOCK_CHARS):
            if len(blocks) >= MAX_BLOCKS:
                break
            piece = text[start : start + BLOCK_CHARS]
            # Python's own hash (SipHash, in C): a third of a chained blake2b's cost.
            # It differs between processes, so each gateway's table is its own; only
            # the rendezvous key below must be the same everywhere.
            h = hash((h, piece))
            chars += len(piece)
            blocks.append(h)
            ends.append(chars)
            # The key's blocks: a chat's first message whole and the first block of its
            # second (the system prompt and the conversation's opening), else the first
            # RENDEZVOUS_BLOCKS. Only the first block of each is hashed into the key
            # (a long system prompt hashed whole cost 34 us on a loaded machine); the
            # chained blocks still tell whether a replica holds all of them.
            opening = (m == 0 and len(texts) > 1) or (m == 1 and start == 0)
            if opening or (len(texts) == 1 and key_blocks < RENDEZVOUS_BLOCKS):
                key_blocks += 1
                if start == 0 or len(texts) == 1:
                    head.append(piece)
    key = int.from_bytes(
        hashlib.blake2b("\x00".join(head).encode("utf-8", "surrogatepass"), digest_size=8).digest(),
        "big",
    )
    return Prompt(tuple(blocks), tuple(ends), chars, key, key_blocks)


def _mix(x: int) -> int:
    # As the session profile's rendezvous hashing (gateway.stages.routing): breaks the
    # symmetry of key ^ replica hash.
    x = (x ^ (x >> 31)) * 0x9E3779B97F4A7C15 & _MASK
    return x ^ (x >> 29)


def rendezvous_score(key: int, r: Replica) -> float:
    """Weighted rendezvous hashing: the replica with the highest score owns ``key``."""
    u = (_mix(key ^ r.hash) + 1) / (_MASK + 2)
    return -r.weight / math.log(u)


@dataclass(slots=True)
class Stats:
    """One replica's guesses against its engine's counts (for ``GET /routing``)."""

    checked: int = 0  # answers whose engine reported its cached tokens
    predicted_tokens: int = 0
    cached_tokens: int = 0  # the engine's own count
    prompt_tokens: int = 0
    misses: int = 0  # guesses answered with less than MISS_BELOW of them

    def view(self) -> dict[str, Any]:
        return {
            "checked": self.checked,
            "predicted_cached_tokens": self.predicted_tokens,
            "cached_tokens": self.cached_tokens,
            "prompt_tokens": self.prompt_tokens,
            "hit_rate": round(self.cached_tokens / self.prompt_tokens, 4)
            if self.prompt_tokens
            else None,
            "predicted_hit_rate": round(self.predicted_tokens / self.prompt_tokens, 4)
            if self.prompt_tokens
            else None,
            "misses": self.misses,
        }


@dataclass(slots=True)
class Ticket:
    """One prompt sent to one replica: what was guessed, to check with the answer."""

    replica: str
    prompt: Prompt
    matched: int  # blocks guessed cached
    # The sequence number each matched block had before this send touched it.
    seqs: list[int] = field(default_factory=list)

    def predicted(self, prompt_tokens: int | None) -> int:
        """The guess in the engine's tokens (its prompt count shared out by characters),
        or about 4 characters a token when the engine did not count."""
        if not self.matched:
            return 0
        chars = self.prompt.ends[self.matched - 1]
        if prompt_tokens is None or self.prompt.chars <= 0:
            return chars // 4
        return round(prompt_tokens * chars / self.prompt.chars)


class PrefixTable:
    """Per replica, the blocks recently sent there (LRU, ``per_replica`` at most)."""

    def __init__(self, per_replica: int = BLOCKS_PER_REPLICA) -> None:
        self.per_replica = per_replica
        self._held: dict[int, set[str]] = {}
        # replica -> block -> sequence number of its last send (LRU order)
        self._lru: dict[str, OrderedDict[int, int]] = {}
        self._seq = 0
        self.stats: dict[str, Stats] = {}

    def __len__(self) -> int:
        return sum(len(x) for x in self._lru.values())

    def blocks(self, replica: str) -> int:
        return len(self._lru.get(replica, ()))

    def match(self, prompt: Prompt, replicas: Sequence[Replica]) -> dict[str, int]:
        """Per replica of ``replicas``, how many of the prompt's leading blocks it holds
        (the deepest block it holds: a chained block stands for its whole prefix, and
        ``record`` keeps a prefix's head the most recently used)."""
        keys = {r.key for r in replicas}
        out = dict.fromkeys(keys, 0)
        held = self._held
        for i in range(len(prompt.blocks) - 1, -1, -1):
            holders = held.get(prompt.blocks[i])
            if holders:
                for key in holders & keys:
                    if not out[key]:
                        out[key] = i + 1
        return out

    def deepest(self, prompt: Prompt, keys: set[str]) -> tuple[int, set[str]]:
        """The most leading blocks any of ``keys`` holds, and which hold that many: a
        scan from the prompt's end, which stops at the first block held (one look-up
        per block, one set operation per block held)."""
        held = self._held
        for i in range(len(prompt.blocks) - 1, -1, -1):
            holders = held.get(prompt.blocks[i])
            if holders:
                found = holders & keys
                if found:
                    return i + 1, found
        return 0, keys

    def record(self, replica: str, prompt: Prompt, matched: int) -> Ticket:
        """The prompt sent to ``replica``: its blocks become the most recently used."""
        lru = self._lru.get(replica)
        if lru is None:
            lru = self._lru[replica] = OrderedDict()
        ticket = Ticket(replica, prompt, matched)
        held = self._held
        seqs = [0] * matched
        # From the last block to the first: a prefix's head is the most recently used,
        # so the least recently used end of the table is a prefix's tail (as vLLM frees
        # a request's blocks from the tail), and a held block's prefix is held too.
        for i in range(len(prompt.blocks) - 1, -1, -1):
            block = prompt.blocks[i]
            self._seq += 1
            before = lru.get(block)
            if i < matched:
                seqs[i] = before if before is not None else 0
            if before is not None:
                lru.move_to_end(block)
            else:
                holders = held.get(block)
                if holders is None:
                    held[block] = {replica}
                else:
                    holders.add(replica)
            lru[block] = self._seq
        ticket.seqs = seqs
        while len(lru) > self.per_replica:
            self._drop(replica, lru.popitem(last=False)[0])
        return ticket

    def _drop(self, replica: str, block: int) -> None:
        holders = self._held.get(block)
        if holders is not None:
            holders.discard(replica)
            if not holders:
                del self._held[block]

    def check(self, ticket: Ticket, prompt_tokens: int | None, cached_tokens: int) -> int:
        """The engine's count for a ticket's answer: tallied, and on a miss the blocks
        the engine evicted forgotten. Returns the tokens that were predicted."""
        predicted = ticket.predicted(prompt_tokens)
        stats = self.stats.get(ticket.replica)
        if stats is None:
            stats = self.stats[ticket.replica] = Stats()
        stats.checked += 1
        stats.predicted_tokens += predicted
        stats.cached_tokens += cached_tokens
        stats.prompt_tokens += prompt_tokens or 0
        if predicted > 0 and cached_tokens < MISS_BELOW * predicted:
            stats.misses += 1
            self._evicted(ticket, prompt_tokens, cached_tokens)
        return predicted

    def _evicted(self, ticket: Ticket, prompt_tokens: int | None, cached: int) -> None:
        # The first guessed block the engine did not have: every block last sent to the
        # replica no later than it had been is gone from the engine too (LRU).
        p = ticket.prompt
        cached_chars = cached * p.chars / prompt_tokens if prompt_tokens and p.chars else cached * 4
        first = next((i for i in range(ticket.matched) if p.ends[i] > cached_chars), None)
        if first is None:
            return
        lru = self._lru.get(ticket.replica)
        if lru is None:
            return
        cutoff = ticket.seqs[first]
        while lru:
            block, seq = next(iter(lru.items()))
            if seq > cutoff:
                break
            del lru[block]
            self._drop(ticket.replica, block)

    def retain(self, live: set[str]) -> None:
        """Forget the replicas no longer in the routing table."""
        for replica in [k for k in self._lru if k not in live]:
            for block in self._lru.pop(replica):
                self._drop(replica, block)
            self.stats.pop(replica, None)


@dataclass(slots=True)
class Pick:
    replica: Replica
    matched: int  # blocks guessed cached there
    # Why, made into text only when read (``GET /routing``): not on every request.
    why: Callable[[], str]

    @property
    def reason(self) -> str:
        return self.why()


def choose(
    replicas: Sequence[Replica],
    inflight: Sequence[float],
    prompt: Prompt,
    table: PrefixTable,
) -> Pick:
    """The replica for ``prompt``: ``inflight[i]`` is ``replicas[i]``'s in-flight
    requests per unit of weight. ``replicas`` is not empty."""
    least = min(inflight)
    near = [r for r, n in zip(replicas, inflight, strict=True) if n - least <= BALANCE]
    n, holders = table.deepest(prompt, {r.key for r in near})
    # A cached prefix shorter than the key's blocks (a system prompt many conversations
    # share) says nothing the rendezvous hash does not: every gateway sends it alike,
    # whatever each happened to see.
    tied = [r for r in near if r.key in holders] if n >= prompt.key_blocks else near
    key = prompt.key
    if all(r.weight == tied[0].weight for r in tied):
        # Equal weights: the highest mixed hash wins, as the weighted score would pick.
        best = max(tied, key=lambda r: _mix(key ^ r.hash))
    else:
        best = max(tied, key=lambda r: rendezvous_score(key, r))
    if best.key not in holders:
        n = table.deepest(prompt, {best.key})[0]
    skipped, among, longest = len(replicas) - len(near), len(near), tied is not near

    def why() -> str:
        spill = (
            f"; {skipped} more than {BALANCE:g} in flight above the least loaded passed over"
            if skipped
            else ""
        )
        blocks = len(prompt.blocks)
        if longest:
            return f"prefix: {n} of {blocks} blocks cached there, longest of {among}{spill}"
        return (
            f"prefix: rendezvous of its first blocks among {among} ({n} of {blocks} blocks "
            f"cached there){spill}"
        )

    return Pick(best, n, why)
