"""tinyllm.tools.data and tinyllm.tools.train on the CPU: the assistant-only loss mask, packing, the
tokenized-data cache, the special pieces, and short training runs (loss falls, resume is
exact). Data: the first few hundred real conversations when the tinychat-distill files are
present, else synthetic ones; the tokenizer is trained on them here."""

from __future__ import annotations

import json
import lzma
import random
from pathlib import Path

import pytest
import torch

from tinyllm.formats.checkpoint import load_checkpoint
from tinyllm.text.chat_template import get_template
from tinyllm.text.tokenizer import Tokenizer
from tinyllm.tools import data
from tinyllm.tools.train import main

REPO = Path(__file__).resolve().parents[2]
REAL = [REPO / "data" / "tinychat-distill", Path("/work/shared/data/tinychat-distill")]
N_CONVERSATIONS = 300
CHATML = get_template("chatml")

SYSTEM_CONV = [
    {"role": "system", "content": "You are TinyChat."},
    {"role": "user", "content": "What is a cat?"},
    {"role": "assistant", "content": "A cat is a small furry animal."},
    {"role": "user", "content": "And a dog?"},
    {"role": "assistant", "content": "A dog is a loyal pet.\nIt barks."},
]


def _real_lines(n: int) -> list[bytes]:
    for folder in REAL:
        files = sorted(folder.glob("*.jsonl.xz"))
        if files:
            with lzma.open(files[0], "rb") as f:
                return [line for _, line in zip(range(n), f, strict=False)]
    return []


def _synthetic_lines(n: int) -> list[bytes]:
    rng = random.Random(0)
    words = "cat dog tree river song house light stone bird cloud apple road".split()
    lines = []
    for _ in range(n):
        msgs = []
        for _ in range(rng.choice((1, 2))):
            w = rng.choice(words)
            msgs += [{"role": "user", "content": f"What does the word {w} mean?"},
                     {"role": "assistant", "content": f"The word {w} means a {w}. For example: the {w} "
                                                      f"is near the {rng.choice(words)}."}]
        lines.append(json.dumps({"messages": msgs, "src": "synthetic"}).encode() + b"\n")
    return lines


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models train faster on one thread, and don't stall when other processes share the cores."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("chat")
    lines = _real_lines(N_CONVERSATIONS) or _synthetic_lines(N_CONVERSATIONS)
    lines.append(json.dumps({"messages": SYSTEM_CONV}).encode() + b"\n")
    with lzma.open(d / "chat-000.jsonl.xz", "wb") as f:
        f.writelines(lines)
    return d


@pytest.fixture(scope="module")
def tok_path(data_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tok")
    assert main(["tokenizer", "--data", str(data_dir), "--out", str(out), "--vocab-size", "512"]) == 0
    return out / "tokenizer.model"


@pytest.fixture(scope="module")
def tok(tok_path) -> Tokenizer:
    return Tokenizer.load(tok_path)


def test_special_pieces_encode_to_one_id_each(tok):
    for piece in data.SPECIAL_PIECES:
        ids = tok.encode(piece)
        assert ids == [tok.piece_to_id(piece)], piece
        assert tok.decode(ids) == piece
    text = "<|im_start|>user\nHi there<|im_end|>\n"
    ids = tok.encode(text)
    assert ids.count(tok.piece_to_id("<|im_start|>")) == 1 and ids.count(tok.piece_to_id("<|im_end|>")) == 1
    assert tok.decode(ids) == text


def test_segments_render_chatml_as_chat_session_encodes_it():
    segs = data.render_segments(SYSTEM_CONV, CHATML)
    assert segs == [
        ("<|im_start|>system\nYou are TinyChat.<|im_end|>\n", False),
        ("<|im_start|>user\nWhat is a cat?<|im_end|>\n<|im_start|>assistant\n", False),
        ("A cat is a small furry animal.", True), ("<|im_end|>", True), ("\n", False),
        ("<|im_start|>user\nAnd a dog?<|im_end|>\n<|im_start|>assistant\n", False),
        ("A dog is a loyal pet.\nIt barks.", True), ("<|im_end|>", True), ("\n", False),
    ]


def _runs(y: torch.Tensor) -> list[list[int]]:
    """Maximal runs of trained targets (y != -100) in a 1-D target row."""
    runs, cur = [], []
    for v in y.tolist():
        if v == -100:
            if cur:
                runs.append(cur)
            cur = []
        else:
            cur.append(v)
    return runs + ([cur] if cur else [])


def test_loss_mask_covers_exactly_the_assistant_replies(tok):
    ids, trained = data.tokenize_conversation(tok, SYSTEM_CONV, CHATML)
    assert ids[0] == tok.bos_id and not trained[0]
    row = torch.tensor(ids + [tok.pad_id] * 5, dtype=torch.int32)[None]  # (1, T + 1), padded
    mask = torch.tensor(trained + [False] * 5)[None]
    x, y = data.rows_to_batch(row, mask)  # (1, T) each
    assert torch.equal(x[0], row[0, :-1].long())
    # Targets are the next token exactly where that token is trained, -100 everywhere else.
    for t in range(x.shape[1]):
        want = int(row[0, t + 1]) if mask[0, t + 1] else -100
        assert int(y[0, t]) == want, t
    # The trained spans decode to each reply plus its closing <|im_end|>, nothing more.
    replies = [m["content"] + "<|im_end|>" for m in SYSTEM_CONV if m["role"] == "assistant"]
    assert [tok.decode(r) for r in _runs(y[0])] == replies
    # Everything else (system, user turns, role headers, the newline after <|im_end|>) is masked.
    masked = [int(row[0, t + 1]) for t in range(x.shape[1])
              if y[0, t] == -100 and row[0, t + 1] != tok.pad_id]
    assert tok.decode(masked) == (
        "<|im_start|>system\nYou are TinyChat.<|im_end|>\n"
        "<|im_start|>user\nWhat is a cat?<|im_end|>\n<|im_start|>assistant\n" "\n"
        "<|im_start|>user\nAnd a dog?<|im_end|>\n<|im_start|>assistant\n" "\n")


def test_packed_rows_keep_conversations_whole_and_pads_untrained(tok):
    convs = [SYSTEM_CONV, SYSTEM_CONV[1:3], SYSTEM_CONV[3:], SYSTEM_CONV[1:3]]
    split = data.tokenize_split(tok, convs)
    lens = (split.offsets[1:] - split.offsets[:-1]).tolist()
    row_len = max(lens) + 3
    rows = data.pack_rows(split, row_len, tok.pad_id)
    assert rows.truncated == 0 and len(rows) < len(convs)  # several conversations share a row
    assert int((rows.tokens != tok.pad_id).sum()) == sum(lens)
    assert not rows.trained[rows.tokens == tok.pad_id].any()
    x, y = next(data.eval_batches(rows, len(rows), torch.device("cpu")))
    replies = sorted(m["content"] + "<|im_end|>" for c in convs for m in c if m["role"] == "assistant")
    assert sorted(tok.decode(r) for row in y for r in _runs(row)) == replies
    assert (x == tok.bos_id).sum() == len(convs)  # every conversation starts with BOS


def test_best_fit_assigns_disjoint_spans_within_rows():
    rng = random.Random(1)
    lens = [rng.randint(1, 40) for _ in range(500)]
    row, col, n_rows = data.assign_rows(lens, 64)
    used = [[0] * 64 for _ in range(n_rows)]
    for r, c, n in zip(row, col, lens, strict=True):
        for i in range(c, c + n):
            assert not used[r][i]
            used[r][i] = 1
    assert n_rows <= -(-sum(lens) // 64) + 2  # within 2 rows of perfect packing


def test_split_is_by_line_hash_and_the_cache_is_reused(tok, data_dir, tmp_path):
    train, held = data.read_split(data_dir, eval_per_mille=100)
    assert len(train) + len(held) == N_CONVERSATIONS + 1 and 0 < len(held) < len(train)
    again = data.read_split(data_dir, eval_per_mille=100)
    assert again == (train, held)
    first, cached = data.load_tokenized(tok, data_dir, tmp_path, eval_per_mille=100, workers=1,
                                        log=lambda s: None)
    assert not cached
    second, cached = data.load_tokenized(tok, data_dir, tmp_path, eval_per_mille=100, workers=1)
    assert cached and len(list(tmp_path.glob("tokens-*.pt"))) == 1
    for k in ("train", "eval"):
        assert torch.equal(first[k].ids, second[k].ids) and torch.equal(first[k].trained, second[k].trained)
    assert second["eval"].n_conversations == len(held)


def _model_args(tok_path: Path, data_dir: Path, out: Path, cache: Path, *extra: str) -> list[str]:
    return ["model", "--tokenizer", str(tok_path), "--data", str(data_dir), "--cache-dir", str(cache),
            "--out", str(out), "--preset", "tiny", "--seq-len", "256", "--batch-size", "8",
            "--eval-per-mille", "100", "--lr", "3e-3", "--min-lr", "3e-4", "--warmup", "5",
            "--log-every", "5", "--workers", "1", *extra]


def _log(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]


def test_training_lowers_the_eval_loss_and_saves_a_checkpoint(tok_path, data_dir, tmp_path):
    out = tmp_path / "run"
    assert main(_model_args(tok_path, data_dir, out, tmp_path / "cache",
                            "--max-steps", "40", "--eval-every", "20", "--ckpt-every", "20")) == 0
    evals = [r["eval_loss"] for r in _log(out) if "eval_loss" in r and "event" not in r]
    assert len(evals) == 3 and evals[-1] < evals[0] - 1.0, evals
    train_lines = [r for r in _log(out) if "loss" in r]
    assert train_lines and {"step", "loss", "lr", "tok_s", "elapsed"} <= set(train_lines[0])
    ck = load_checkpoint(out / "ckpt")
    assert ck.info.chat == {"template": "chatml", "stop": ["<|im_end|>"]}
    assert ck.model.cfg.n_layers == 2 and ck.tokenizer.serialized() == tok_path.read_bytes()
    assert all(f.stat().st_size <= 15 * 2**20 for f in (out / "ckpt").glob("*.safetensors"))
    assert (out / "best" / "config.json").is_file()


def test_resume_continues_exactly_where_it_stopped(tok_path, data_dir, tmp_path, capsys):
    cache = tmp_path / "cache"
    whole, split = tmp_path / "whole", tmp_path / "split"
    assert main(_model_args(tok_path, data_dir, whole, cache, "--max-steps", "10", "--eval-every", "0")) == 0
    assert main(_model_args(tok_path, data_dir, split, cache, "--max-steps", "10", "--stop-at", "6",
                            "--eval-every", "0")) == 0
    assert torch.load(split / "train_state.pt", weights_only=True)["run"]["step"] == 6
    # A fresh run into a folder that holds one is refused; so is --resume where there is none.
    assert main(_model_args(tok_path, data_dir, split, cache, "--max-steps", "10")) == 2
    none = tmp_path / "none"
    assert main(_model_args(tok_path, data_dir, none, cache, "--max-steps", "10", "--resume")) == 2
    assert "error: " in capsys.readouterr().err
    assert main(_model_args(tok_path, data_dir, split, cache, "--max-steps", "10", "--eval-every", "0",
                            "--resume")) == 0
    log = _log(split)
    starts = [r for r in log if r.get("event") == "start"]
    assert [s["from_step"] for s in starts] == [0, 6]
    assert [r["step"] for r in log if "loss" in r] == [5, 10]
    a = torch.load(whole / "train_state.pt", weights_only=True)
    b = torch.load(split / "train_state.pt", weights_only=True)
    assert b["run"]["step"] == 10 and b["run"]["consumed"] == a["run"]["consumed"]
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    assert all(int(s["step"]) == 10 for s in b["optimizer"]["state"].values())


def test_budget_stops_in_time_after_evaluating_and_saving(tok_path, data_dir, tmp_path):
    out = tmp_path / "budget"
    assert main(_model_args(tok_path, data_dir, out, tmp_path / "cache", "--budget-minutes", "0.15",
                            "--eval-every", "0")) == 0
    done = _log(out)[-1]
    assert done["event"] == "done" and done["reason"] == "budget" and done["step"] > 0
    assert 0.15 * 60 / 2 < done["elapsed"] <= 0.15 * 60  # used most of it, and ended in time
    assert torch.load(out / "train_state.pt", weights_only=True)["run"]["step"] == done["step"]


@pytest.mark.cuda
def test_compiled_bf16_training_on_cuda(tok_path, data_dir, tmp_path):
    out = tmp_path / "cuda"
    assert main(_model_args(tok_path, data_dir, out, tmp_path / "cache", "--max-steps", "40",
                            "--eval-every", "20", "--device", "cuda", "--compile")) == 0
    evals = [r["eval_loss"] for r in _log(out) if "eval_loss" in r and "event" not in r]
    assert evals[-1] < evals[0] - 1.0, evals
    ck = load_checkpoint(out / "ckpt", device="cuda")
    assert ck.model.dtype == torch.bfloat16


def test_packing_with_bos_reads_each_row_as_one_multi_turn_chat(tok):
    convs = [SYSTEM_CONV[1:3], SYSTEM_CONV[3:], SYSTEM_CONV[1:3], SYSTEM_CONV[3:]]
    split = data.tokenize_split(tok, convs)
    lens = (split.offsets[1:] - split.offsets[:-1]).tolist()
    rows = data.pack_rows(split, 2 * max(lens) + 4, tok.pad_id, tok.bos_id)
    assert len(rows) < len(convs)
    assert (rows.tokens[:, 0] == tok.bos_id).all() and (rows.tokens == tok.bos_id).sum() == len(rows)
    assert int((rows.tokens != tok.pad_id).sum()) == sum(lens) - len(convs) + len(rows)
    x, y = next(data.eval_batches(rows, len(rows), torch.device("cpu")))
    replies = sorted(m["content"] + "<|im_end|>" for c in convs for m in c if m["role"] == "assistant")
    assert sorted(tok.decode(r) for row in y for r in _runs(row)) == replies  # the mask survives


def test_init_starts_from_a_checkpoint_and_freeze_trains_only_the_embedding(tok_path, data_dir, tmp_path, capsys):
    cache, first, second = tmp_path / "cache", tmp_path / "first", tmp_path / "second"
    assert main(_model_args(tok_path, data_dir, first, cache, "--max-steps", "4", "--eval-every", "0")) == 0
    init = load_checkpoint(first / "ckpt", quant="none").model.state_dict()
    assert main(_model_args(tok_path, data_dir, second, cache, "--max-steps", "2", "--eval-every", "0",
                            "--init", str(first / "ckpt"), "--freeze-body", "2", "--dim", "64")) == 0
    log = _log(second)
    start = next(r for r in log if r.get("event") == "start")
    assert start["model"] == load_checkpoint(first / "ckpt").model.cfg.to_dict()  # the init's shape, not --dim
    assert [r["event"] for r in log if r.get("event") in ("freeze", "unfreeze")] == ["freeze"]
    evals = [r["eval_loss"] for r in _log(first) if "eval_loss" in r]
    assert abs([r["eval_loss"] for r in log if "eval_loss" in r][0] - evals[-1]) < 1e-3  # step 0 = the init
    after = torch.load(second / "train_state.pt", weights_only=True)["model"]
    moved = {k for k in init if not torch.equal(init[k], after[k].to(init[k].dtype))}
    assert moved == {"tok_emb.weight", "lm_head.weight"}, moved  # tied: one table, two names
    # --train-params: only what the regex finds moves, for the whole run (weight decay included).
    third = tmp_path / "third-layers"
    assert main(_model_args(tok_path, data_dir, third, cache, "--max-steps", "2", "--eval-every", "0",
                            "--init", str(first / "ckpt"), "--train-params", r"_norm\.|^blocks\.0\.")) == 0
    after = torch.load(third / "train_state.pt", weights_only=True)["model"]
    moved = {k for k in init if not torch.equal(init[k], after[k].to(init[k].dtype))}
    assert moved and all(k.startswith("blocks.0.") or "_norm." in k for k in moved), moved
    assert any(k.startswith("blocks.0.attn.") for k in moved) and "tok_emb.weight" not in moved
    capsys.readouterr()
    assert main(_model_args(tok_path, data_dir, tmp_path / "none", cache, "--max-steps", "1",
                            "--init", str(first / "ckpt"), "--train-params", "^nothing")) == 2
    assert "names no parameter" in capsys.readouterr().err
    # An init made with another tokenizer is refused with one line.
    other = tmp_path / "other"
    assert main(["tokenizer", "--data", str(data_dir), "--out", str(other), "--vocab-size", "400"]) == 0
    capsys.readouterr()
    assert main(_model_args(other / "tokenizer.model", data_dir, tmp_path / "third", cache, "--max-steps", "1",
                            "--init", str(first / "ckpt"))) == 2
    assert "another tokenizer" in capsys.readouterr().err
