"""Train a chat tokenizer and a small chat model: `python -m tinyllm.train tokenizer|model ...`.

  tokenizer  trains a byte-fallback BPE sentencepiece model on a sample of the training split
             (ChatML-rendered, "<|im_start|>"/"<|im_end|>" as special pieces) -> OUT/tokenizer.model
  model      trains a Transformer on the packed, assistant-only-masked rows of `tinyllm.data`

Contract of `model`:
- AdamW (betas 0.9/0.95, no decay on norms), linear warmup over `warmup` steps, then cosine
  from `lr` to `min_lr`. Progress is steps / `max_steps`, or elapsed / budget when only a
  budget is given (the later of the two when both are).
- bf16 autocast on CUDA over fp32 master weights; fp32 on the CPU. `--compile` wraps the
  model in torch.compile (the saved weights are the uncompiled module's).
- Wall-clock budget (`--budget-minutes`, counted from the start of the call plus the time
  of earlier calls on resume): it stops early enough to evaluate and save before the budget
  ends (the reserve is the last measured eval time plus twice the last save time).
- Eval loss (mean over trained tokens of the held-out split) at step 0, every `eval_every`
  steps / `eval_every_s` seconds, and at the end.
- OUT holds: ckpt/ (the latest tinyllm checkpoint: bf16 shards of at most 15 MiB, the
  tokenizer, chat settings {"template", "stop"}), best/ (the checkpoint with the lowest eval
  loss so far), train_state.pt (fp32 weights, optimizer, step, rows consumed, elapsed: what
  `--resume` continues from), log.jsonl (the JSON lines also printed to stdout).
- Refuses (ValueError, one line on stderr, exit 2): no budget and no max_steps, a fresh run
  into an OUT that already holds one, --resume without train_state.pt or with another tokenizer.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import random
import sys
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch

from tinyllm import data
from tinyllm.chat_template import get_template
from tinyllm.checkpoint import save_checkpoint
from tinyllm.model import ModelConfig, Transformer
from tinyllm.tokenizer import Tokenizer, train_sentencepiece

STATE = "train_state.pt"
LOG = "log.jsonl"


@dataclass
class TrainConfig:
    out: str  # run folder: ckpt/, best/, train_state.pt, log.jsonl
    tokenizer: str  # tokenizer.model, or a folder holding one
    data: str = "data/tinychat-distill"  # folder of *.jsonl.xz conversations
    cache_dir: str = "data/cache"  # tokenized-data cache (git-ignored)
    template: str = "chatml"  # chat template (tinyllm.chat_template)
    eval_per_mille: int = 10  # held-out conversations per 1000 (by hash of the line)
    preset: str = "tinychat"  # ModelConfig preset; the fields below override it
    dim: int | None = None
    n_layers: int | None = None
    n_heads: int | None = None
    n_kv_heads: int | None = None
    ffn_dim: int | None = None
    max_seq_len: int | None = None  # inference context (>= seq_len)
    tie_embeddings: bool | None = None
    seq_len: int = 1024  # training row length (tokens per row)
    batch_size: int = 32  # rows per micro-batch
    grad_accum: int = 1  # micro-batches per optimizer step
    lr: float = 2e-3  # peak learning rate
    min_lr: float = 2e-4  # learning rate at the end of the cosine
    warmup: int = 100  # linear warmup steps
    weight_decay: float = 0.1  # AdamW decay on matrices (not norms)
    grad_clip: float = 1.0  # max global grad norm (0: off)
    budget_minutes: float = 0.0  # wall-clock budget over all calls (0: none)
    max_steps: int = 0  # stop after this many steps (0: none)
    eval_every: int = 250  # steps between evals (0: off)
    eval_every_s: float = 0.0  # seconds between evals (0: off)
    eval_rows: int = 0  # cap on held-out rows per eval (0: all)
    ckpt_every: int = 1000  # steps between checkpoints (0: only at the end)
    log_every: int = 20  # steps between train-loss log lines
    compile: bool = False  # torch.compile the model
    seed: int = 0  # init and data order
    resume: bool = False  # continue OUT/train_state.pt
    device: str = "auto"  # auto | cuda | cpu
    save_dtype: str = "bf16"  # bf16 | fp32 weights in ckpt/ and best/
    name: str | None = None  # model name in config.json (default: OUT's name)
    workers: int = 0  # tokenizing processes (0: all cores)


# ---- the tokenizer step ---------------------------------------------------------------

def render_text(messages: data.Messages, template_name: str) -> str:
    return "".join(text for text, _ in data.render_segments(messages, get_template(template_name)))


def train_tokenizer(data_dir: str, out: str, vocab_size: int, sample: int = 100_000,
                    template: str = "chatml", eval_per_mille: int = 10, seed: int = 0) -> Path:
    """Train sentencepiece on `sample` training conversations; returns OUT/tokenizer.model."""
    t0 = time.perf_counter()
    train, _ = data.read_split(data_dir, eval_per_mille)
    convs = random.Random(seed).sample(train, min(sample, len(train)))
    texts = [render_text(m, template) for m in convs]
    path = train_sentencepiece(texts, Path(out) / "tokenizer", vocab_size, data.SPECIAL_PIECES)
    tok = Tokenizer.load(path)
    log(None, {"event": "tokenizer", "path": str(path), "vocab_size": tok.vocab_size,
               "conversations": len(texts), "chars": sum(map(len, texts)),
               "seconds": round(time.perf_counter() - t0, 1)})
    return path


# ---- the model step -------------------------------------------------------------------

def log(out: Path | None, record: dict) -> None:
    line = json.dumps(record)
    print(line, flush=True)
    if out is not None:
        with open(out / LOG, "a") as f:
            f.write(line + "\n")


def resolve_tokenizer(path: str) -> Path:
    p = Path(path)
    p = p / "tokenizer.model" if p.is_dir() else p
    if not p.is_file():
        raise FileNotFoundError(f"no tokenizer at {path}; run `python -m tinyllm.train tokenizer` first")
    return p


def model_config(cfg: TrainConfig, vocab_size: int) -> ModelConfig:
    over = {f: getattr(cfg, f) for f in ("dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim",
                                          "max_seq_len", "tie_embeddings") if getattr(cfg, f) is not None}
    over["vocab_size"] = -(-vocab_size // 64) * 64  # padded to a multiple of 64
    mc = ModelConfig.from_name(cfg.preset, **over)
    if mc.max_seq_len < cfg.seq_len:
        mc.max_seq_len = cfg.seq_len
    return mc


def lr_at(cfg: TrainConfig, step: int, elapsed: float, reserve: float) -> float:
    """Warmup factor times cosine(progress) between lr and min_lr."""
    progress = 0.0
    if cfg.max_steps:
        progress = step / cfg.max_steps
    if cfg.budget_minutes:
        progress = max(progress, elapsed / max(cfg.budget_minutes * 60 - reserve, 1.0))
    progress = min(progress, 1.0)
    cosine = cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * progress))
    return cosine * min(1.0, (step + 1) / max(cfg.warmup, 1))


def make_optimizer(model: Transformer, cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": other, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(0.9, 0.95), eps=1e-8,
                             fused=device.type == "cuda")


def autocast(device: torch.device):
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()


@torch.no_grad()
def evaluate(fmodel, rows: data.PackedRows, cfg: TrainConfig, device: torch.device) -> float:
    """Mean loss over every trained token of the held-out rows."""
    fmodel.eval()
    total = torch.zeros((), device=device)
    count = 0
    for x, y in data.eval_batches(rows, cfg.batch_size, device, cfg.eval_rows or None):
        n = int((y != -100).sum())
        if n:
            with autocast(device):
                _, loss = fmodel(x, targets=y)
            total += loss.float() * n
            count += n
    fmodel.train()
    return float(total) / max(count, 1)


@dataclass
class RunState:
    step: int = 0
    consumed: int = 0  # training rows consumed (the data order's position)
    elapsed: float = 0.0  # seconds spent by earlier calls
    best_eval: float = math.inf
    eval_loss: float = math.nan


def save_run(out: Path, model: Transformer, opt, tok: Tokenizer, cfg: TrainConfig, st: RunState,
             tok_sha: str, name: str, sub: str = "ckpt", with_state: bool = True) -> None:
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[cfg.save_dtype]
    chat = {"template": cfg.template, "stop": list(get_template(cfg.template).stop)}
    save_checkpoint(model, tok, out / sub, name=name, chat=chat, shard_mb=15, dtype=dtype)
    if with_state:
        state = {"run": asdict(st), "model_config": model.cfg.to_dict(), "model": model.state_dict(),
                 "optimizer": opt.state_dict(), "train_config": asdict(cfg), "tokenizer_sha": tok_sha}
        torch.save(state, out / (STATE + ".tmp"))
        (out / (STATE + ".tmp")).replace(out / STATE)


def folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


def train_model(cfg: TrainConfig) -> dict:
    """Train (or resume) one run; returns the final log record."""
    t0 = time.perf_counter()
    if not cfg.budget_minutes and not cfg.max_steps:
        raise ValueError("give --budget-minutes or --max-steps (or both)")
    out = Path(cfg.out)
    if cfg.resume and not (out / STATE).is_file():
        raise FileNotFoundError(f"--resume: no {STATE} in {out}; start without --resume")
    if not cfg.resume and (out / STATE).is_file():
        raise ValueError(f"{out} already holds a run; pass --resume to continue it or pick another --out")
    out.mkdir(parents=True, exist_ok=True)
    device = torch.device(cfg.device if cfg.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    tok_path = resolve_tokenizer(cfg.tokenizer)
    tok = Tokenizer.load(tok_path)
    tok_sha = hashlib.sha256(tok.serialized()).hexdigest()
    splits, cached = data.load_tokenized(tok, cfg.data, cfg.cache_dir, cfg.template, cfg.eval_per_mille,
                                         cfg.workers or None, log=lambda s: log(out, json.loads(s)))
    train_rows = data.pack_rows(splits["train"], cfg.seq_len + 1, tok.pad_id)
    eval_rows = data.pack_rows(splits["eval"], cfg.seq_len + 1, tok.pad_id)
    if len(train_rows) < cfg.batch_size:
        raise ValueError(f"only {len(train_rows)} training rows of {cfg.seq_len + 1} tokens; lower --batch-size")

    st, saved = RunState(), None
    if cfg.resume:
        saved = torch.load(out / STATE, map_location="cpu", weights_only=True)
        if saved["tokenizer_sha"] != tok_sha:
            raise ValueError(f"--resume: {tok_path} is not the tokenizer this run was trained with")
        st = RunState(**saved["run"])
        mcfg = ModelConfig.from_dict(saved["model_config"])
    else:
        mcfg = model_config(cfg, tok.vocab_size)
    torch.manual_seed(cfg.seed)
    model = Transformer(mcfg).init_weights(cfg.seed)
    if saved is not None:
        model.load_state_dict(saved["model"])
    model.to(device).train()
    opt = make_optimizer(model, cfg, device)
    if saved is not None:
        opt.load_state_dict(saved["optimizer"])
    del saved
    fmodel = torch.compile(model) if cfg.compile else model
    sampler = data.RowSampler(train_rows, device, cfg.seed, st.consumed)
    name = cfg.name or out.name
    tokens_per_step = cfg.batch_size * cfg.grad_accum * cfg.seq_len
    log(out, {"event": "start", "resume": cfg.resume, "from_step": st.step, "device": str(device),
              "params": model.num_params(), "model": mcfg.to_dict(), "tokens_per_step": tokens_per_step,
              "train_rows": len(train_rows), "eval_rows": len(eval_rows), "truncated": train_rows.truncated,
              "cached_tokens": cached, "setup_s": round(time.perf_counter() - t0, 1), "config": asdict(cfg)})

    budget, prior = cfg.budget_minutes * 60, st.elapsed
    elapsed = lambda: prior + time.perf_counter() - t0  # noqa: E731
    eval_s, ckpt_s, best_s, step_s = 0.0, 5.0, 5.0, 0.0  # measured as we go (saves: guesses)
    reserve = lambda: eval_s + best_s + ckpt_s + 2 * step_s + 2.0  # noqa: E731
    evaluated_at = -1

    def save(sub: str = "ckpt") -> float:
        ts = time.perf_counter()
        st.consumed, st.elapsed = sampler.consumed, elapsed()
        save_run(out, model, opt, tok, cfg, st, tok_sha, name, sub, with_state=sub == "ckpt")
        return time.perf_counter() - ts

    def run_eval() -> None:
        nonlocal eval_s, best_s, evaluated_at
        te = time.perf_counter()
        st.eval_loss = evaluate(fmodel, eval_rows, cfg, device)
        eval_s, evaluated_at = time.perf_counter() - te, st.step
        log(out, {"step": st.step, "eval_loss": round(st.eval_loss, 4), "elapsed": round(elapsed(), 1),
                  "tokens": st.step * tokens_per_step, "epoch": round(sampler.epoch, 3), "eval_s": round(eval_s, 1)})
        if st.eval_loss < st.best_eval:
            st.best_eval = st.eval_loss
            best_s = save("best")

    run_eval()
    last_eval_t, reason = time.perf_counter(), "max_steps"
    win_t, win_steps, loss_sum = time.perf_counter(), 0, torch.zeros((), device=device)
    while not cfg.max_steps or st.step < cfg.max_steps:
        if budget and elapsed() + reserve() >= budget:
            reason = "budget"
            break
        ts = time.perf_counter()
        lr = lr_at(cfg, st.step, elapsed(), reserve())
        for g in opt.param_groups:
            g["lr"] = lr
        for _ in range(cfg.grad_accum):
            x, y = sampler.next(cfg.batch_size)  # (B, T) each
            with autocast(device):
                _, loss = fmodel(x, targets=y)
            (loss / cfg.grad_accum).backward()
            loss_sum += loss.detach().float() / cfg.grad_accum
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip) if cfg.grad_clip else None
        opt.step()
        opt.zero_grad(set_to_none=True)
        st.step += 1
        win_steps += 1
        step_s = time.perf_counter() - ts if st.step > 3 else step_s  # first steps include compiling
        if st.step % cfg.log_every == 0:
            mean_loss = float(loss_sum) / win_steps  # syncs
            dt = time.perf_counter() - win_t
            log(out, {"step": st.step, "loss": round(mean_loss, 4), "lr": round(lr, 7),
                      "grad_norm": round(float(norm), 3) if norm is not None else None,
                      "tok_s": round(win_steps * tokens_per_step / dt), "elapsed": round(elapsed(), 1),
                      "tokens": st.step * tokens_per_step, "epoch": round(sampler.epoch, 3)})
            step_s = dt / win_steps
            win_t, win_steps, loss_sum = time.perf_counter(), 0, torch.zeros((), device=device)
        due_s = cfg.eval_every_s and time.perf_counter() - last_eval_t >= cfg.eval_every_s
        if (cfg.eval_every and st.step % cfg.eval_every == 0) or due_s:
            run_eval()
            last_eval_t = time.perf_counter()
        if cfg.ckpt_every and st.step % cfg.ckpt_every == 0:
            ckpt_s = save()
            log(out, {"event": "checkpoint", "step": st.step, "path": str(out / "ckpt"), "save_s": round(ckpt_s, 1)})
    if evaluated_at != st.step:
        run_eval()
    save()
    final = {"event": "done", "reason": reason, "step": st.step, "eval_loss": round(st.eval_loss, 4),
             "best_eval_loss": round(st.best_eval, 4), "elapsed": round(elapsed(), 1),
             "tokens": st.step * tokens_per_step, "epoch": round(sampler.epoch, 3),
             "params": model.num_params(), "ckpt_bytes": folder_bytes(out / "ckpt"), "ckpt": str(out / "ckpt")}
    log(out, final)
    return final


# ---- the CLI --------------------------------------------------------------------------

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tinyllm.train", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("tokenizer", help="train the sentencepiece tokenizer")
    t.add_argument("--data", default="data/tinychat-distill")
    t.add_argument("--out", required=True, help="folder for tokenizer.model")
    t.add_argument("--vocab-size", type=int, default=8192)
    t.add_argument("--sample", type=int, default=100_000, help="conversations to train on")
    t.add_argument("--template", default="chatml")
    t.add_argument("--eval-per-mille", type=int, default=10)
    m = sub.add_parser("model", help="train a model")
    for f in fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        if f.name == "tie_embeddings":
            m.add_argument(flag, action=argparse.BooleanOptionalAction, default=None)
        elif f.type in ("bool",):
            m.add_argument(flag, action="store_true")
        else:
            kind = {"int": int, "float": float}.get(str(f.type).split(" ")[0], str)
            required = f.name in ("out", "tokenizer")
            m.add_argument(flag, type=kind, required=required, default=None if required else f.default)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.cmd == "tokenizer":
            train_tokenizer(args.data, args.out, args.vocab_size, args.sample, args.template, args.eval_per_mille)
        else:
            cfg = TrainConfig(**{f.name: getattr(args, f.name) for f in fields(TrainConfig)})
            train_model(cfg)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
