"""Branches: a chat as a tree of messages, one branch of it shown (the store's model of reply versions).

Contract: each message has a `parent` (the one before it on its branch; None for a chat's
first) and a chat keeps its active `leaf`. `path(leaf)` is the branch shown, first message
first: what the screen, the model, /export and the chat list follow. Messages with one
parent and one role are versions of each other (`versions`): Ctrl+R makes a new version of
a reply, an edit one of a user message. `newest_leaf(m, messages)` is where a switch to `m`
lands: down from `m` through the newest child each time. `inferred(rows)` gives parents to
rows written before chat.db kept them: the standing messages (not `replaced`) one after
another, and each turn an edit replaced beside the edit that replaced it.
Pure functions over chat_app.rows.Saved; no I/O, no Textual.
"""

from __future__ import annotations

from collections.abc import Container, Sequence

from chat_app.rows import Saved, path  # noqa: F401 (path: the branch a leaf ends, the rows' own)


def versions(message: Saved, messages: Sequence[Saved]) -> list[Saved]:
    """`message` and its other versions (one parent, one role), oldest first."""
    return [m for m in messages if m.parent is message.parent and m.role == message.role]


def newest_leaf(message: Saved, messages: Sequence[Saved]) -> Saved:
    """The end of the branch through `message` that was written last: its newest child, that
    one's newest child, and so on (`messages` in the order they were written)."""
    children: dict[int, Saved] = {}
    for m in messages:  # a later one overwrites: the newest child of each
        if m.parent is not None:
            children[id(m.parent)] = m
    while id(message) in children:
        message = children[id(message)]
    return message


def inferred(rows: Sequence[tuple[int, bool]]) -> list[int | None]:
    """Parents (as indexes into `rows`) for rows written before chat.db kept them: `rows` are
    (a role code: 1 for a user message, else 0; replaced) in the order written. A standing
    row follows the standing row before it; a replaced user message starts a branch beside
    the standing row that comes after the standing ones before it, and the replaced rows after
    it follow it."""
    parents: list[int | None] = []
    tip: int | None = None  # the last standing row so far
    old: int | None = None  # the last replaced row so far
    for i, (user, replaced) in enumerate(rows):
        if not replaced:
            parents.append(tip)
            tip = i
        elif user:
            parents.append(tip)
            old = i
        else:
            parents.append(old if old is not None else tip)
            old = i
    return parents


def tree(rows: Sequence[tuple[int, object, bool, bool]], leaf: object,
         good: Container[int]) -> tuple[dict[int, int | None], int | None]:
    """A chat's tree as chat.db holds it: `rows` are every message row of one chat in the order
    written, (row id, its parent column, a user message, replaced); `leaf` the conversation's
    leaf column; `good` the rows that could be read (the others are skipped, their replies
    hung on the nearest good row above). Returns each good row's parent (a good row, or None
    for a first message) and the leaf (a good row; None: no good row).
    A parent column of NULL is a row from before parents were kept (`inferred`); 0 is none;
    one that is not an earlier row of this chat (a file edited by hand) is none too, so the
    tree never has a cycle. A leaf that is NULL (kept from before), 0 or not found is the last
    standing row."""
    ids = [row for row, *_ in rows]
    guessed = inferred([(user, replaced) for _, _, user, replaced in rows])
    parent: dict[int, int | None] = {}
    for i, (row, column, _, _) in enumerate(rows):
        if column is None:
            parent[row] = None if guessed[i] is None else ids[guessed[i]]
        else:
            parent[row] = column if isinstance(column, int) and column in parent else None  # earlier rows only

    def nearest_good(row: int | None) -> int | None:
        while row is not None and row not in good:
            row = parent.get(row)
        return row

    parents = {row: nearest_good(parent[row]) for row in ids if row in good}
    at = nearest_good(leaf) if isinstance(leaf, int) and leaf in parent else None
    if at is None:
        standing = [row for row, _, _, replaced in rows if row in good and not replaced]
        at = standing[-1] if standing else next((row for row in reversed(ids) if row in good), None)
    return parents, at
