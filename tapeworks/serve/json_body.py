"""A request body read as TF Serving reads JSON: no recursion the input drives, in short pieces.

Python's `json` module recurses once per level of nesting (a body nested
100,000 levels deep raised RecursionError, a 500) and decodes a whole body
in one C call that holds the GIL (a 10 MB body held the event loop's thread
for a quarter of a second). TF Serving's rapidjson parses iteratively, takes
`NaN`/`Infinity`/`-Infinity`, and ignores the members it does not read,
however deep (its json_tensor_test.cc `DeeplyNestedWellFormed`: 500,000
levels under an unknown key parse).

Here the body's structure is read first, vectorised with numpy and without
recursion: where strings are (quotes not escaped by an odd run of
backslashes), every bracket, comma and colon outside them, and the level
of nesting at each. Then:

- the top-level object is cut into members at its own commas and colons;
- a member nested deeper than `MAX_DEPTH` levels is refused (400, naming the
  key) when it is one TF Serving reads (`READ_KEYS`), and skipped otherwise
  (its brackets checked to match, iteratively);
- every other value is decoded in pieces of at most about `PIECE_BYTES` (a
  large array: groups of its elements), so no one C call holds the GIL for
  long and the event loop's thread gets it back between pieces. Nesting is
  bounded by `MAX_DEPTH` before a decoder sees a piece.

A piece is decoded by orjson, which reads strict JSON about three times as
fast as `json.loads` (a 1M-value predict body: 0.15 s against 0.47 s, the
figure in benchmarks/serve-orjson); a piece orjson refuses (the `NaN` and
`Infinity` tokens TF Serving accepts, numbers beyond a double's range, an
escaped lone surrogate, or an error) is decoded again by `json.loads`,
which reads those tokens as Python does and words the errors. Integers
beyond 64 bits come back as doubles, as rapidjson reads them in TF Serving
(an int64 input refuses them either way).

Invalid UTF-8 and escaped lone surrogates (`"\\ud800"`) are refused as
rapidjson refuses them, so no string the server later encodes can fail.
"""

import json
import re

import numpy as np
import orjson

from tapeworks.serve.servable import RequestError

# Levels of nesting read in a member TF Serving reads: the document, the
# `instances` list, an instance object and a tensor of up to 60 dimensions
# (numpy's arrays have at most 64).
MAX_DEPTH = 64
# The members of a request TF Serving's REST API reads; deeper ones are refused.
READ_KEYS = ("signature_name", "instances", "inputs", "examples", "context")
PIECE_BYTES = 1 << 18

_OPEN, _CLOSE = (ord("["), ord("{")), (ord("]"), ord("}"))
_IS_STRUCTURAL = np.zeros(256, bool)
_IS_STRUCTURAL[[ord(c) for c in "[]{},:"]] = True
_DELTA = np.zeros(256, np.int64)
_DELTA[list(_OPEN)], _DELTA[list(_CLOSE)] = 1, -1
_WHITESPACE = b" \t\r\n"
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def snippet(text, limit=80):
    """The start of a JSON text, for messages ("JSON Value: ...")."""
    text = text.decode("utf-8", errors="replace") if isinstance(text, bytes) else text
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def parse_error(what, offset):
    return RequestError(f"JSON Parse error: {what} at offset: {offset}")


class _Structure:
    """Where the structural characters of a JSON text are, and at which level of nesting."""

    def __init__(self, body):
        data = np.frombuffer(body, np.uint8)
        quotes = np.flatnonzero(data == ord('"'))
        if len(quotes) and b"\\" in body:
            # A quote is escaped when an odd run of backslashes precedes it.
            backslashes = np.flatnonzero(data == ord("\\"))
            # Runs of consecutive backslashes: where each run starts.
            new_run = np.ones(len(backslashes), bool)
            new_run[1:] = np.diff(backslashes) != 1
            run_start = backslashes[new_run][np.cumsum(new_run) - 1]
            index = np.minimum(np.searchsorted(backslashes, quotes - 1), len(backslashes) - 1)
            touching = backslashes[index] == quotes - 1
            run = np.where(touching, quotes - run_start[index], 0)
            quotes = quotes[run % 2 == 0]
        if len(quotes) % 2:
            raise parse_error("Missing a closing quotation mark in string.", int(quotes[-1]))
        # Structural characters outside strings: those after an even number of quotes.
        candidates = np.flatnonzero(_IS_STRUCTURAL[data])
        candidates = candidates[np.searchsorted(quotes, candidates) % 2 == 0]
        chars = data[candidates]
        delta = _DELTA[chars]
        after = np.cumsum(delta)
        if len(after) and after.min() < 0:
            where = int(candidates[np.argmax(after < 0)])
            raise parse_error("Missing a name for object member." if body[where] == ord("}")
                              else "Invalid value.", where)
        # The level of the container each character belongs to: an opening
        # bracket's own, a closing bracket's own, a comma's or colon's.
        self.level = after + (delta == -1)
        self.positions, self.chars = candidates, chars
        self.depth = int(after.max()) if len(after) else 0
        self.unclosed = bool(len(after) and after[-1] != 0)

    def range(self, start, end):
        """(first, last) indices of the structural characters in body[start:end]."""
        return (int(np.searchsorted(self.positions, start)),
                int(np.searchsorted(self.positions, end)))

    def depth_of(self, start, end, base):
        """Levels of nesting of the value in body[start:end], which sits at level `base`."""
        first, last = self.range(start, end)
        return int(self.level[first:last].max()) - base if last > first else 0

    def separators(self, start, end, level, char=","):
        first, last = self.range(start, end)
        chosen = (self.level[first:last] == level) & (self.chars[first:last] == ord(char))
        return self.positions[first:last][chosen]


def _strip(body, start, end):
    while start < end and body[start] in _WHITESPACE:
        start += 1
    while end > start and body[end - 1] in _WHITESPACE:
        end -= 1
    return start, end


def _loads(body, start, end, prefix=b"", suffix=b""):
    text = prefix + body[start:end] + suffix
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        pass   # NaN/Infinity tokens, out-of-range numbers, lone surrogates, errors
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        # rapidjson's words ("Invalid value." for what is not JSON at all), as
        # TF Serving reports them, with Python's own detail.
        what = ("Invalid value." if error.msg.startswith("Expecting value") else
                "Missing a closing quotation mark in string."
                if error.msg.startswith("Unterminated string") else error.msg)
        offset = start + max(error.pos - len(prefix), 0)
        raise RequestError(f"JSON Parse error: {what} at offset: {offset} "
                           f"({error.msg})") from None


def _check_brackets_match(body, structure, start, end):
    """An ignored, deeply nested value: its brackets must match (an explicit stack)."""
    first, last = structure.range(start, end)
    stack = []
    pairs = {ord("]"): ord("["), ord("}"): ord("{")}
    for position, char in zip(structure.positions[first:last].tolist(),
                              structure.chars[first:last].tolist()):
        if char in _OPEN:
            stack.append(char)
        elif char in pairs:
            if not stack or stack.pop() != pairs[char]:
                raise parse_error("Missing a comma or ']' after an array element."
                                  if char == ord("}") else
                                  "Missing a comma or '}' after an object member.", position)


class _Reader:
    def __init__(self, body, structure):
        self.body, self.structure = body, structure

    def value(self, start, end, base):
        """The JSON value in body[start:end] (at nesting level `base`), decoded in pieces."""
        start, end = _strip(self.body, start, end)
        if start >= end:
            raise parse_error("Invalid value.", start)
        if end - start <= PIECE_BYTES or self.body[start] != ord("["):
            return _loads(self.body, start, end)
        if self.body[end - 1] != ord("]"):
            raise parse_error("Missing a comma or ']' after an array element.", end - 1)
        # A large array: its elements, a group of them per decoder call. The
        # groups are found with searchsorted (a Python step per group, not per
        # element: 250,000 rows made 250,000 steps, a fifth of the parse).
        commas = self.structure.separators(start + 1, end - 1, base + 1)
        bounds = np.concatenate(([start + 1], commas + 1))
        ends = np.append(commas, end - 1)
        items, index = [], 0
        while index < len(bounds):
            group_start = int(bounds[index])
            # The last element ending within PIECE_BYTES of the group's start.
            last = int(np.searchsorted(ends, group_start + PIECE_BYTES, side="right")) - 1
            if last < index:   # one element larger than a piece: its own elements
                items.append(self.value(group_start, int(ends[index]), base + 1))
                index += 1
                continue
            items.extend(_loads(self.body, group_start, int(ends[last]), b"[", b"]"))
            index = last + 1
        return items


def parse(body):
    """The request's top-level JSON object as a dict; RequestError (400) with TF Serving's words.

    Members nested deeper than MAX_DEPTH levels are skipped when TF Serving
    would not read them, refused when it would.
    """
    if not body or not body.strip(_WHITESPACE):
        raise RequestError("JSON Parse error: The document is empty")
    body = bytes(body)
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as error:
        raise parse_error("Invalid encoding in string.", error.start) from None
    if len(body) <= PIECE_BYTES and body.count(b"[") + body.count(b"{") <= MAX_DEPTH:
        # Small, and too few brackets to nest deeper than MAX_DEPTH: one call
        # (most requests; the structure costs more than they do).
        document = _loads(body, 0, len(body))
        if not isinstance(document, dict):
            raise RequestError(f"JSON Value: {snippet(json.dumps(document))} Is not object")
        if _SURROGATE_ESCAPE.search(body):
            _check_surrogates(document)
        return document
    structure = _Structure(body)
    start, end = _strip(body, 0, len(body))
    if body[start] != ord("{"):
        if structure.depth > MAX_DEPTH:
            raise RequestError(f"JSON Value: {snippet(body[start:end])} Is not object")
        value = _loads(body, start, end)
        raise RequestError(f"JSON Value: {snippet(json.dumps(value))} Is not object")
    if structure.unclosed or body[end - 1] != ord("}"):
        _loads(body, start, end)   # Python's message for what is missing
        raise parse_error("Missing a comma or '}' after an object member.", end)
    reader = _Reader(body, structure)
    document = {}
    commas = structure.separators(start + 1, end - 1, 1).tolist()
    if not commas and not body[start + 1:end - 1].strip(_WHITESPACE):
        return document
    for lo, hi in zip([start + 1] + [c + 1 for c in commas], commas + [end - 1]):
        colons = structure.separators(lo, hi, 1, ":")
        if not len(colons):
            raise parse_error("Missing a colon after a name of object member.", hi)
        colon = int(colons[0])
        key = _loads(body, *_strip(body, lo, colon))
        if not isinstance(key, str):
            raise parse_error("Missing a name for object member.", lo)
        value_start, value_end = _strip(body, colon + 1, hi)
        depth = structure.depth_of(value_start, value_end, 1)
        if depth + 1 > MAX_DEPTH:
            if key == "signature_name":
                raise RequestError(f"JSON Value: {snippet(body)} not formatted correctly. "
                                   "'signature_name' key must be a string value.")
            if key in READ_KEYS:
                raise RequestError(
                    f"JSON Parse error: '{key}' is nested {depth} levels deep; at most "
                    f"{MAX_DEPTH - 1} levels are read in a request's member (a tensor has at "
                    "most 60 dimensions). Fix: send the tensor with as many levels of lists "
                    "as it has dimensions.")
            _check_brackets_match(body, structure, value_start, value_end)
            continue   # TF Serving ignores members it does not read, however deep
        document[key] = reader.value(value_start, value_end, 1)
    if _SURROGATE_ESCAPE.search(body):
        _check_surrogates(document)
    return document


def _check_surrogates(document):
    """Escaped lone surrogates ("\\ud800") are not text: refused as rapidjson refuses them."""
    stack = [document]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
        elif isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as error:
                raise RequestError(
                    "JSON Parse error: The surrogate pair in string is invalid. (a lone "
                    f"surrogate \\u{ord(value[error.start]):04x} in a string: JSON text must "
                    "be valid Unicode)") from None
