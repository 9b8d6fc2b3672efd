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
replicas. A send touches its blocks in C (``map`` and ``dict.update`` over a dict kept
in the order of last sends), not a Python step per block.

The cost, for a 4k-token chat (38 blocks) and 64 replicas (``python -m bench prefix
--cost``, docs/benchmarks/prefix-routing.md): about 45 us of CPU added to least-loaded's
decision on a loaded 2-core machine, 383k instructions (476k before the table's touch
and the cut went to C); most of it is hashing the prompt's text (SipHash over 16k
characters) and cutting it.

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
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate, islice, repeat
from typing import Any

from gateway.table import Replica

# A long text is cut every this many characters (about 128 tokens of English): a 4k-token
# prompt is about 32 blocks, hashed and looked up in tens of microseconds.
BLOCK_CHARS = 512
# Blocks hashed per prompt at most (256 x 512 characters, about 32k tokens).
MAX_BLOCKS = 256
# Blocks remembered per replica (least recently used forgotten first): about 8M
# characters of prompts, 2M tokens; a block costs about 200 bytes (its entry in the
# replica's dict and in the index; measured with tracemalloc), so about 3 MB per replica.
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
# A message's content parts read at most: joined with a separator each, this many make a
# text longer than MAX_BLOCKS blocks.
_MAX_PARTS = MAX_BLOCKS * BLOCK_CHARS + 1
# A long text's blocks: BLOCK_CHARS characters each, the last one shorter.
_CUT = re.compile(f".{{1,{BLOCK_CHARS}}}", re.DOTALL)


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
        # Each message starts a block, so no more than MAX_BLOCKS of them are hashed, and
        # a text of that many parts (one separator each) is already longer than MAX_BLOCKS
        # blocks: only those are read. (Every message was read, then cut: 350 ms on the
        # event loop for a body of 2.7 million empty messages.)
        for m in islice(messages, MAX_BLOCKS):
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
                    for p in islice(content, _MAX_PARTS)
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
    if len(texts) == 1 and len(texts[0]) <= BLOCK_CHARS:
        # One block (a short prompt, a chat's first short message), as below without
        # the cut, the chain and the sums.
        text = texts[0]
        return Prompt((hash((0, text)),), (len(text),), len(text), _key([text]), 1)
    pieces: list[str] = []
    head: list[str] = []  # the key's first block of each of its messages
    key_blocks = 0
    chat = len(texts) > 1
    for m, text in enumerate(texts):
        # Cut by a regular expression (in C): half the cost of a comprehension of slices.
        cut = [text] if len(text) <= BLOCK_CHARS else _CUT.findall(text)
        # The key's blocks: a chat's first message whole and the first block of its
        # second (the system prompt and the conversation's opening), else the first
        # RENDEZVOUS_BLOCKS. Only the first block of each is hashed into the key (a
        # long system prompt hashed whole cost 34 us on a loaded machine); the chained
        # blocks still tell whether a replica holds all of them.
        if chat and m < 2:
            key_blocks += len(cut) if m == 0 else 1
            head.append(cut[0])
        pieces += cut
        if len(pieces) >= MAX_BLOCKS:
            del pieces[MAX_BLOCKS:]
            break
    if not chat:
        head = pieces[:RENDEZVOUS_BLOCKS]
        key_blocks = len(head)
    # Block i's name: a hash chained over every block up to it. Python's own string
    # hash (SipHash in C; about 0.25 us a block of 512 characters here, most of the
    # hashing: the Python step around it is not), a third of a chained blake2b's cost.
    # It differs between processes, so each gateway's table is its own; only the
    # rendezvous key below must be the same everywhere.
    h = 0
    blocks = tuple([h := hash((h, piece)) for piece in pieces])
    ends = tuple(accumulate(map(len, pieces)))
    return Prompt(blocks, ends, ends[-1], _key(head), min(key_blocks, len(blocks)))


def _key(head: list[str]) -> int:
    """The rendezvous key of the key's blocks: the same in every gateway process."""
    data = "\x00".join(head).encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


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
    # The sequence number each matched block had before this send touched it (None:
    # not held there after all).
    seqs: list[int | None] = field(default_factory=list)

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
    """Per replica, the blocks recently sent there (LRU, ``per_replica`` at most).

    Per replica, a dict from each block to the sequence number of its last send, in the
    order of those sends (a dict keeps its insertion order: a block sent again is taken
    out and put back at the end), so the least recently used block is the dict's first.
    A send's blocks are taken out and put back by ``map`` and ``dict.update``, in C: no
    Python step per block held already."""

    def __init__(self, per_replica: int = BLOCKS_PER_REPLICA) -> None:
        self.per_replica = per_replica
        self._held: dict[int, set[str]] = {}
        # replica -> block -> sequence number of its last send, oldest first
        self._last: dict[str, dict[int, int]] = {}
        self._seq = 0
        self.stats: dict[str, Stats] = {}

    def __len__(self) -> int:
        return sum(len(x) for x in self._last.values())

    def blocks(self, replica: str) -> int:
        return len(self._last.get(replica, ()))

    def match(self, prompt: Prompt, replicas: Sequence[Replica]) -> dict[str, int]:
        """Per replica of ``replicas``, how many of the prompt's leading blocks it holds
        (the deepest block it holds: a block stands for its whole prefix, and
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
        last = self._last.get(replica)
        if last is None:
            last = self._last[replica] = {}
        blocks = prompt.blocks
        n = len(blocks)
        if n == 1:
            return self._record_one(replica, last, prompt, matched)
        base = self._seq
        self._seq = base + n
        # Each block taken out (to be put back at the end), with the sequence number of
        # its last send here (None: not held here), by map in C.
        before = list(map(last.pop, blocks, repeat(None, n)))
        ticket = Ticket(replica, prompt, matched, before[:matched])
        # Put back from the last block to the first, which gets the highest number: a
        # prefix's head is the most recently used, so the least recently used end of
        # the table is a prefix's tail (as vLLM frees a request's blocks from the tail),
        # and a held block's prefix is held too.
        last.update(zip(reversed(blocks), range(base + 1, base + n + 1), strict=True))
        if None in before:
            held = self._held
            for block, seq in zip(blocks, before, strict=True):
                if seq is None:
                    holders = held.get(block)
                    if holders is None:
                        held[block] = {replica}
                    else:
                        holders.add(replica)
        excess = len(last) - self.per_replica
        if excess > 0:
            for block in list(islice(last, excess)):
                del last[block]
                self._drop(replica, block)
        return ticket

    def _record_one(
        self, replica: str, last: dict[int, int], prompt: Prompt, matched: int
    ) -> Ticket:
        """``record`` of a prompt of one block, without its steps for many."""
        block = prompt.blocks[0]
        seq = last.pop(block, None)
        self._seq += 1
        last[block] = self._seq
        if seq is None:
            holders = self._held.get(block)
            if holders is None:
                self._held[block] = {replica}
            else:
                holders.add(replica)
            if len(last) > self.per_replica:
                oldest = next(iter(last))
                del last[oldest]
                self._drop(replica, oldest)
        return Ticket(replica, prompt, matched, [seq] if matched else [])

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
        last = self._last.get(ticket.replica)
        if last is None:
            return
        cutoff = ticket.seqs[first] or 0
        gone = []
        for block, seq in last.items():  # oldest first
            if seq > cutoff:
                break
            gone.append(block)
        for block in gone:
            del last[block]
            self._drop(ticket.replica, block)

    def retain(self, live: set[str]) -> None:
        """Forget the replicas no longer in the routing table."""
        for replica in [k for k in self._last if k not in live]:
            for block in self._last.pop(replica):
                self._drop(replica, block)
            self.stats.pop(replica, None)


@dataclass(slots=True)
class Pick:
    """The replica chosen, and why (``reason``, made into text only when read: ``GET
    /routing``, refusals; a ``Pick`` is its own ``Choice.why``, so a choice made on every
    request makes no closure)."""

    replica: Replica
    matched: int  # blocks guessed cached there
    # Chosen for the longest cached prefix covering the rendezvous key's blocks (its
    # conversation is there), not by the rendezvous hash alone.
    longest: bool = False
    blocks: int = 0  # the prompt's
    among: int = 0  # replicas within the balance bound
    skipped: int = 0  # replicas passed over, past it

    def __call__(self) -> str:
        spill = (
            f"; {self.skipped} more than {BALANCE:g} in flight above the least loaded passed over"
            if self.skipped
            else ""
        )
        n, blocks = self.matched, self.blocks
        if self.longest:
            return f"prefix: {n} of {blocks} blocks cached there, longest of {self.among}{spill}"
        return (
            f"prefix: rendezvous of its first blocks among {self.among} ({n} of {blocks} "
            f"blocks cached there){spill}"
        )

    @property
    def reason(self) -> str:
        return self()


def choose(
    replicas: Sequence[Replica],
    inflight: Sequence[float],
    prompt: Prompt,
    table: PrefixTable,
) -> Pick:
    """The replica for ``prompt``: ``inflight[i]`` is ``replicas[i]``'s in-flight
    requests per unit of weight. ``replicas`` is not empty.

    (Loops rather than comprehensions, ``max`` with a key and ``all``: this is every
    request's path under the profile, and each of those is a frame of its own.)"""
    least = min(inflight)
    near: list[Replica] = []
    keys = set()
    for r, load in zip(replicas, inflight, strict=True):
        if load - least <= BALANCE:
            near.append(r)
            keys.add(r.key)
    n, holders = table.deepest(prompt, keys)
    # A cached prefix shorter than the key's blocks (a system prompt many conversations
    # share) says nothing the rendezvous hash does not: every gateway sends it alike,
    # whatever each happened to see.
    longest = n >= prompt.key_blocks
    tied = [r for r in near if r.key in holders] if longest else near
    key = prompt.key
    weight = tied[0].weight
    best = tied[0]
    if all(r.weight == weight for r in tied):
        # Equal weights: the highest mixed hash wins, as the weighted score would pick
        # (``_mix`` inline; the first of equal ones, as ``max``).
        top = -1
        for r in tied:
            x = key ^ r.hash
            x = (x ^ (x >> 31)) * 0x9E3779B97F4A7C15 & _MASK
            x ^= x >> 29
            if x > top:
                best, top = r, x
    else:
        best = max(tied, key=lambda r: rendezvous_score(key, r))
    if best.key not in holders:
        n = table.deepest(prompt, {best.key})[0]
    skipped = len(replicas) - len(near)
    return Pick(best, n, longest, len(prompt.blocks), len(near), skipped)
