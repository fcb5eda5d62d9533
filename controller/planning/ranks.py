"""The rank grammar: ``resource_ranks[:process_ranks]`` strings and rank lists.

The grammar (the configuration reference, ``docs/reference/configuration.md``)::

    placement := segment ("," segment)*
    segment   := resources [":" processes]
    resources := "all" | range
    processes := range
    range     := INT | INT "-" INT

A real tokenizer feeds a recursive-descent parser, so every error can point at the
character where the input stopped making sense. This module knows nothing about
clusters: range checks against real resources happen in :mod:`controller.layout`.
"""

from __future__ import annotations

import msgspec

from controller.errors import PlacementStringError

MAX_PROCESSES = 1 << 20
"""Most processes (or ranks) one string may describe; larger inputs are refused."""

_INT, _DASH, _COLON, _COMMA, _ALL, _END = "number", "'-'", "':'", "','", "'all'", "end"


class Segment(msgspec.Struct, frozen=True):
    """One ``resources[:processes]`` segment, as written.

    ``resources`` is ``None`` for ``all``; ``processes`` is ``None`` when omitted.
    Ranges are inclusive ``(start, end)`` pairs.
    """

    resources: tuple[int, int] | None
    processes: tuple[int, int] | None
    text: str


class _Token(msgspec.Struct, frozen=True):
    kind: str
    pos: int
    text: str
    value: int = 0


def _tokenize(text: str, what: str) -> list[_Token]:
    tokens: list[_Token] = []
    i, n = 0, len(text)
    punct = {"-": _DASH, ":": _COLON, ",": _COMMA}
    while i < n:
        ch = text[i]
        if ch in " \t":
            i += 1
        elif ch in punct:
            tokens.append(_Token(punct[ch], i, ch))
            i += 1
        elif "0" <= ch <= "9":
            j = i
            while j < n and "0" <= text[j] <= "9":
                j += 1
            tokens.append(_Token(_INT, i, text[i:j], int(text[i:j])))
            i = j
        elif text[i : i + 3].lower() == "all" and not text[i + 3 : i + 4].isalnum():
            tokens.append(_Token(_ALL, i, text[i : i + 3]))
            i += 3
        else:
            raise PlacementStringError(
                f"{what} {text!r}: unexpected character {ch!r} at position {i}; "
                "allowed are digits, '-', ':', ',', spaces and the word 'all'"
            )
    tokens.append(_Token(_END, n, ""))
    return tokens


class _Parser:
    def __init__(self, text: str, what: str) -> None:
        self.text = text
        self.what = what
        self.tokens = _tokenize(text, what)
        self.i = 0

    @property
    def tok(self) -> _Token:
        return self.tokens[self.i]

    def fail(self, message: str) -> PlacementStringError:
        return PlacementStringError(f"{self.what} {self.text!r}: {message}")

    def found(self) -> str:
        tok = self.tok
        return "the end of the string" if tok.kind == _END else f"{tok.text!r}"

    def range(self, side: str) -> tuple[int, int]:
        tok = self.tok
        if tok.kind == _ALL:
            raise self.fail(
                f"'all' at position {tok.pos} is not allowed for {side}; "
                "it may only stand for resource ranks"
            )
        if tok.kind != _INT:
            raise self.fail(
                f"expected a rank for {side} at position {tok.pos}, found {self.found()}"
            )
        self.i += 1
        start = end = tok.value
        if self.tok.kind == _DASH:
            self.i += 1
            if self.tok.kind != _INT:
                raise self.fail(
                    f"expected the end of the range '{tok.text}-' at position "
                    f"{self.tok.pos}, found {self.found()}"
                )
            end = self.tok.value
            self.i += 1
            if start > end:
                raise self.fail(
                    f"range '{start}-{end}' runs backwards; write ranges as start-end "
                    "with start <= end"
                )
        return start, end

    def segment(self) -> Segment:
        first = self.tok
        if first.kind in (_COMMA, _END):
            raise self.fail(f"empty segment at position {first.pos}")
        if first.kind == _ALL:
            self.i += 1
            resources = None
        else:
            resources = self.range("resource ranks")
        processes = None
        if self.tok.kind == _COLON:
            self.i += 1
            if self.tok.kind in (_COMMA, _END):
                raise self.fail(f"missing process ranks after ':' at position {self.tok.pos}")
            processes = self.range("process ranks")
        if self.tok.kind not in (_COMMA, _END):
            raise self.fail(
                f"unexpected {self.found()} at position {self.tok.pos}; "
                "a segment is resource_ranks[:process_ranks]"
            )
        return Segment(resources, processes, self.text[first.pos : self.tok.pos].strip())

    def placement(self) -> list[Segment]:
        segments = [self.segment()]
        while self.tok.kind == _COMMA:
            self.i += 1
            segments.append(self.segment())
        return segments

    def rank_list(self) -> list[tuple[int, int]] | None:
        if self.tok.kind == _ALL:
            self.i += 1
            if self.tok.kind != _END:
                raise self.fail("'all' must stand alone")
            return None
        ranges = []
        while True:
            if self.tok.kind in (_COMMA, _END):
                raise self.fail(f"empty range at position {self.tok.pos}")
            ranges.append(self.range("ranks"))
            if self.tok.kind == _END:
                return ranges
            if self.tok.kind != _COMMA:
                raise self.fail(f"unexpected {self.found()} at position {self.tok.pos}")
            self.i += 1


def _as_text(value: object, what: str) -> str:
    # YAML turns `4` into an int; the spec says it means the string "4".
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise PlacementStringError(
            f"{what} {value!r}: expected a string such as '0-3:0-7' or an int, "
            f"got {type(value).__name__}"
        )
    if isinstance(value, int) and value < 0:
        raise PlacementStringError(f"{what} {value!r}: ranks are never negative")
    return str(value)


def parse_placement(value: str | int, what: str = "placement") -> list[Segment]:
    """Parse a placement string into its segments, checking only the syntax.

    Args:
        value: the string (or an int, which YAML produces for ``4``).
        what: how error messages name the input, e.g. ``"placement of 'actor'"``.

    Raises:
        PlacementStringError: the string breaks the grammar; the message quotes it and
            points at the offending position.
    """
    return _Parser(_as_text(value, what), what).placement()


def parse_rank_list(
    value: str | int, what: str = "ranks", upper: int | None = None
) -> list[int] | None:
    """Parse ``"0-1,3"`` / ``2`` / ``"all"`` into a list of distinct ranks in written order.

    Returns ``None`` for ``all``.

    Raises:
        PlacementStringError: bad syntax, a rank listed twice, or a rank not below
            ``upper`` (when given).
    """
    text = _as_text(value, what)
    ranges = _Parser(text, what).rank_list()
    if ranges is None:
        return None
    count = 0
    for start, end in ranges:
        if upper is not None and end >= upper:
            allowed = f"0-{upper - 1}" if upper > 0 else "none"
            raise PlacementStringError(f"{what} {text!r}: rank {end} is out of range ({allowed})")
        count += end - start + 1
    if count > MAX_PROCESSES:
        raise PlacementStringError(f"{what} {text!r}: lists more than {MAX_PROCESSES} ranks")
    ranks: list[int] = []
    seen: set[int] = set()
    for start, end in ranges:
        for r in range(start, end + 1):
            if r in seen:
                raise PlacementStringError(f"{what} {text!r}: rank {r} is listed twice")
            seen.add(r)
            ranks.append(r)
    return ranks


def format_ranks(ranks: list[int]) -> str:
    """Compress sorted-or-not ints into the grammar's range form: ``[0,1,2,5]`` -> ``0-2,5``."""
    if not ranks:
        return ""
    parts = []
    start = prev = ranks[0]
    for r in ranks[1:]:
        if r == prev + 1:
            prev = r
            continue
        parts.append(f"{start}-{prev}" if prev != start else f"{start}")
        start = prev = r
    parts.append(f"{start}-{prev}" if prev != start else f"{start}")
    return ",".join(parts)


def expand_placement(
    segments: list[Segment],
    unit_node: list[int],
    text: str,
    what: str = "placement",
    noun: str = "resources",
) -> list[list[int]]:
    """Give each process rank the resource ranks it holds.

    Args:
        segments: the parsed string.
        unit_node: the node of every resource rank available (its length is the count).
        text: the string, quoted in errors.
        what: how errors name the input.
        noun: what a resource is, for errors ("accelerators", "nodes", ...).

    Returns:
        ``procs[rank]``: the resource ranks of each process, in rank order.

    Raises:
        PlacementStringError: a rule of the placement string is broken; the message quotes
            the string and the offending segment.
    """
    total = len(unit_node)

    def fail(message: str) -> PlacementStringError:
        return PlacementStringError(f"{what} {text!r}: {message}")

    spans: list[tuple[int, int, Segment]] = []
    chunks: list[tuple[int, list[list[int]]]] = []
    prev: tuple[int, int, Segment] | None = None
    next_rank = 0
    count = 0
    for seg in segments:
        if seg.resources is None:
            if total == 0:
                raise fail(f"'all' selects nothing: there are no {noun}")
            rs, re_ = 0, total - 1
        else:
            rs, re_ = seg.resources
            if re_ >= total:
                allowed = f"0-{total - 1}" if total else f"none: there are no {noun}"
                raise fail(f"resource rank {re_} in '{seg.text}' is out of range ({allowed})")
        if prev is not None:
            ps, pe, pseg = prev
            if rs <= pe and re_ >= ps:
                raise fail(
                    f"resource rank {max(rs, ps)} is used twice ('{pseg.text}' and '{seg.text}')"
                )
            if rs < ps:
                raise fail(
                    f"segments must be in ascending resource order, but '{seg.text}' "
                    f"follows '{pseg.text}'"
                )
        prev = (rs, re_, seg)
        n_res = re_ - rs + 1
        ps_, pe_ = (
            seg.processes if seg.processes is not None else (next_rank, next_rank + n_res - 1)
        )
        n_proc = pe_ - ps_ + 1
        count += n_proc
        if count > MAX_PROCESSES:
            raise fail(f"describes more than {MAX_PROCESSES} processes")
        if n_proc % n_res == 0:
            k = n_proc // n_res
            procs = [[rs + j // k] for j in range(n_proc)]
        elif n_res % n_proc == 0:
            k = n_res // n_proc
            procs = []
            for j in range(n_proc):
                first = rs + j * k
                last = first + k - 1
                if unit_node[first] != unit_node[last]:
                    raise fail(
                        f"process {ps_ + j} in '{seg.text}' would hold resources "
                        f"{first}-{last}, which span nodes {unit_node[first]} and "
                        f"{unit_node[last]}; a process never spans two nodes"
                    )
                procs.append(list(range(first, last + 1)))
        else:
            raise fail(
                f"'{seg.text}' has {n_res} {noun} and {n_proc} processes; one count must be "
                "a whole multiple of the other"
            )
        spans.append((ps_, pe_, seg))
        chunks.append((ps_, procs))
        next_rank = pe_ + 1

    spans.sort(key=lambda s: s[0])
    expected = 0
    for ps_, pe_, seg in spans:
        if ps_ < expected:
            raise fail(f"process rank {ps_} appears twice (again in '{seg.text}')")
        if ps_ > expected:
            missing = f"{expected}" if ps_ - 1 == expected else f"{expected}-{ps_ - 1}"
            raise fail(
                f"process ranks must run from 0 without gaps, but {missing} "
                f"{'is' if ps_ - 1 == expected else 'are'} missing"
            )
        expected = pe_ + 1
    out: list[list[int]] = [[] for _ in range(expected)]
    for start, procs in chunks:
        out[start : start + len(procs)] = procs
    return out
