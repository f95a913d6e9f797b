"""Train a chat tokenizer and a small chat model: `tinyllm train tokenizer|model ...`.

  tokenizer  trains a byte-fallback BPE sentencepiece model on a sample of the training split
             (ChatML-rendered, "<|im_start|>"/"<|im_end|>" as special pieces) -> OUT/tokenizer.model
  tokenize   tokenizes the data into the cache of `tinyllm.tools.data` (the model step does it too)
  model      trains a Transformer on the packed, assistant-only-masked rows of `tinyllm.tools.data`

Contract of `model`:
- AdamW (betas 0.9/0.95, no decay on norms), linear warmup over `warmup` steps, then cosine
  from `lr` to `min_lr`. Progress is steps / `max_steps`, or elapsed / budget when only a
  budget is given (the later of the two when both are).
- bf16 autocast on CUDA over fp32 master weights; fp32 on the CPU. `--compile` wraps the
  model in torch.compile for the training steps (eval and saving use the plain module).
- Wall-clock budget (`--budget-minutes`, counted from the start of the call plus the time
  of earlier calls on resume): it stops early enough to evaluate and save before the budget
  ends (the reserve: the last eval, best/ save and ckpt save times, measured from step 0 on).
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
import inspect
import json
import math
import re
import sys
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch

from tinyllm.formats.checkpoint import save_checkpoint
from tinyllm.formats.load_policy import resolve_device
from tinyllm.model import ModelConfig, Transformer
from tinyllm.text.chat_template import get_template
from tinyllm.text.tokenizer import Tokenizer
from tinyllm.tools import data

STATE = "train_state.pt"
LOG = "log.jsonl"


@dataclass
class TrainConfig:
    out: str  # run folder: ckpt/, best/, train_state.pt, log.jsonl
    tokenizer: str  # tokenizer.model, or a folder holding one
    data: str = "data/tinychat-distill"  # folder of *.jsonl.xz conversations
    cache_dir: str = "data/cache"  # tokenized-data cache (git-ignored)
    template: str = "chatml"  # chat template (tinyllm.text.chat_template)
    eval_per_mille: int = 10  # held-out conversations per 1000 (by hash of the line)
    preset: str = "tinychat"  # ModelConfig preset; the fields below override it
    dim: int | None = None
    n_layers: int | None = None
    n_heads: int | None = None
    n_kv_heads: int | None = None
    ffn_dim: int | None = None
    max_seq_len: int | None = None  # inference context (>= seq_len)
    tie_embeddings: bool | None = None
    init: str | None = None  # start from this tinyllm checkpoint folder (its shape; its tokenizer must be --tokenizer)
    freeze_body: int = 0  # first steps that train only the embedding and the head, the body frozen
    train_params: str = ""  # regex: only parameters whose name it finds train, the rest stay as --init gave them ("": all)
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
    stop_at: int = 0  # end this call after this step, the schedule unchanged (0: none); resume later
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


# ---- the tokenizer and tokenize steps -------------------------------------------------

def tokenize(tokenizer: str, data_dir: str, cache_dir: str, template: str = "chatml",
             eval_per_mille: int = 10, workers: int = 0) -> dict[str, data.TokenizedSplit]:
    t0 = time.perf_counter()
    tok = Tokenizer.load(resolve_tokenizer(tokenizer))
    splits, cached = data.load_tokenized(tok, data_dir, cache_dir, template, eval_per_mille, workers or None)
    log(None, {"event": "tokenize", "cached": cached, "seconds": round(time.perf_counter() - t0, 1),
               **{f"{k}_tokens": len(s.ids) for k, s in splits.items()}})
    return splits


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
        raise FileNotFoundError(f"no tokenizer at {path}; run `tinyllm train tokenizer` first")
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


def trains(cfg: TrainConfig, name: str) -> bool:
    """Whether parameter `name` trains: --train-params finds it, or there is none."""
    try:
        return not cfg.train_params or re.search(cfg.train_params, name) is not None
    except re.error as e:
        raise ValueError(f"--train-params {cfg.train_params!r} is not a regular expression: {e}") from None


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
def evaluate(model: Transformer, rows: data.PackedRows, cfg: TrainConfig, device: torch.device) -> float:
    """Mean loss over every trained token of the held-out rows."""
    model.eval()
    total = torch.zeros((), device=device)
    count = 0
    for x, y in data.eval_batches(rows, cfg.batch_size, device, cfg.eval_rows or None):
        n = int((y != -100).sum())
        if n:
            with autocast(device):
                _, loss = model(x, targets=y)
            total += loss.float() * n
            count += n
    model.train()
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


class Trainer:
    """One call of one run: set up (or resume), then `run()` until max_steps, stop_at or the
    budget, evaluate, save. Timings it measures as it goes size the budget's reserve."""

    def __init__(self, cfg: TrainConfig):
        self.t0 = time.perf_counter()
        self.cfg, self.out = cfg, Path(cfg.out)
        self._check_out()
        self.device = resolve_device(cfg.device)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        tok_path = resolve_tokenizer(cfg.tokenizer)
        self.tok = Tokenizer.load(tok_path)
        self.tok_sha = hashlib.sha256(self.tok.serialized()).hexdigest()
        splits, self.cached = data.load_tokenized(self.tok, cfg.data, cfg.cache_dir, cfg.template,
                                                  cfg.eval_per_mille, cfg.workers or None,
                                                  log=lambda s: log(self.out, json.loads(s)))
        self.train_rows = data.pack_rows(splits["train"], cfg.seq_len + 1, self.tok.pad_id, self.tok.bos_id)
        self.eval_rows = data.pack_rows(splits["eval"], cfg.seq_len + 1, self.tok.pad_id, self.tok.bos_id)
        if len(self.train_rows) < cfg.batch_size:
            raise ValueError(f"only {len(self.train_rows)} training rows of {cfg.seq_len + 1} tokens; "
                             "lower --batch-size")
        saved = torch.load(self.out / STATE, map_location="cpu", weights_only=True) if cfg.resume else None
        if saved is not None and saved["tokenizer_sha"] != self.tok_sha:
            raise ValueError(f"--resume: {tok_path} is not the tokenizer this run was trained with")
        self.st = RunState(**saved["run"]) if saved else RunState()
        init = None if saved is not None or not cfg.init else load_init(cfg.init, self.tok_sha)
        mcfg = (ModelConfig.from_dict(saved["model_config"]) if saved
                else init.cfg if init is not None else model_config(cfg, self.tok.vocab_size))
        torch.manual_seed(cfg.seed)
        self.model = Transformer(mcfg).init_weights(cfg.seed)
        if saved is not None or init is not None:
            self.model.load_state_dict(saved["model"] if saved is not None else init.state_dict())
        self.model.to(self.device).train()
        self.opt = make_optimizer(self.model, cfg, self.device)
        if saved is not None:
            self.opt.load_state_dict(saved["optimizer"])
        self.fmodel = torch.compile(self.model) if cfg.compile else self.model
        self.sampler = data.RowSampler(self.train_rows, self.device, cfg.seed, self.st.consumed)
        self.name = cfg.name or self.out.name
        self.tokens_per_step = cfg.batch_size * cfg.grad_accum * cfg.seq_len
        self.prior = self.st.elapsed  # seconds of earlier calls
        # Seconds, measured as the run goes (the step-0 eval and save measure them first).
        self.eval_s, self.ckpt_s, self.best_s, self.step_s = 0.0, 0.0, 0.0, 0.0
        self.evaluated_at = -1
        self.frozen = False  # see freeze()
        for name, p in self.model.named_parameters():
            p.requires_grad_(trains(cfg, name))
        self.trainable = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
        if not self.trainable:
            raise ValueError(f"--train-params {cfg.train_params!r} names no parameter of this model")

    def _check_out(self) -> None:
        cfg = self.cfg
        if not cfg.budget_minutes and not cfg.max_steps:
            raise ValueError("give --budget-minutes or --max-steps (or both)")
        if cfg.resume and not (self.out / STATE).is_file():
            raise FileNotFoundError(f"--resume: no {STATE} in {self.out}; start without --resume")
        if not cfg.resume and (self.out / STATE).is_file():
            raise ValueError(f"{self.out} already holds a run; pass --resume to continue it "
                             "or pick another --out")
        self.out.mkdir(parents=True, exist_ok=True)

    def elapsed(self) -> float:
        return self.prior + time.perf_counter() - self.t0

    def reserve(self) -> float:
        """Seconds to keep for the final eval and saves."""
        return self.eval_s + self.best_s + 1.5 * self.ckpt_s + 2 * self.step_s + 2.0

    def log(self, record: dict) -> None:
        log(self.out, record)

    def save(self, sub: str = "ckpt") -> float:
        ts = time.perf_counter()
        self.st.consumed, self.st.elapsed = self.sampler.consumed, self.elapsed()
        save_run(self.out, self.model, self.opt, self.tok, self.cfg, self.st, self.tok_sha, self.name, sub,
                 with_state=sub == "ckpt")
        return time.perf_counter() - ts

    def run_eval(self) -> None:
        st, te = self.st, time.perf_counter()
        st.eval_loss = evaluate(self.model, self.eval_rows, self.cfg, self.device)
        self.eval_s, self.evaluated_at = time.perf_counter() - te, st.step
        self.log({"step": st.step, "eval_loss": round(st.eval_loss, 4), "elapsed": round(self.elapsed(), 1),
                  "tokens": st.step * self.tokens_per_step, "epoch": round(self.sampler.epoch, 3),
                  "eval_s": round(self.eval_s, 1)})
        if st.eval_loss < st.best_eval:
            st.best_eval = st.eval_loss
            self.best_s = self.save("best")

    def freeze(self, frozen: bool) -> None:
        """Train only the embedding and the head (one table when tied) while frozen; after, every
        weight that --train-params names (all when it is empty)."""
        for name, p in self.model.named_parameters():
            p.requires_grad_(name.startswith(("tok_emb.", "lm_head.")) if frozen else trains(self.cfg, name))
        self.frozen = frozen
        self.log({"event": "freeze" if frozen else "unfreeze", "step": self.st.step})

    def train_step(self, lr: float) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One optimizer step; (mean loss, grad norm) as device tensors (no sync)."""
        cfg = self.cfg
        if (self.st.step < cfg.freeze_body) != self.frozen:
            self.freeze(not self.frozen)
        for g in self.opt.param_groups:
            g["lr"] = lr
        total = torch.zeros((), device=self.device)
        for _ in range(cfg.grad_accum):
            x, y = self.sampler.next(cfg.batch_size)  # (B, T) each
            with autocast(self.device):
                _, loss = self.fmodel(x, targets=y)
            (loss / cfg.grad_accum).backward()
            total += loss.detach().float() / cfg.grad_accum
        norm = None
        if cfg.grad_clip:
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.st.step += 1
        return total, norm

    def stop_reason(self) -> str | None:
        cfg, step = self.cfg, self.st.step
        if cfg.max_steps and step >= cfg.max_steps:
            return "max_steps"
        if cfg.stop_at and step >= cfg.stop_at:
            return "stop_at"
        if cfg.budget_minutes and self.elapsed() + self.reserve() >= cfg.budget_minutes * 60:
            return "budget"
        return None

    def run(self) -> dict:
        cfg, st = self.cfg, self.st
        self.log({"event": "start", "resume": cfg.resume, "from_step": st.step, "device": str(self.device),
                  "params": self.model.num_params(), "trainable": self.trainable, "model": self.model.cfg.to_dict(),
                  "tokens_per_step": self.tokens_per_step, "train_rows": len(self.train_rows),
                  "eval_rows": len(self.eval_rows), "truncated": self.train_rows.truncated,
                  "cached_tokens": self.cached, "setup_s": round(time.perf_counter() - self.t0, 1),
                  "config": asdict(cfg)})
        self.run_eval()
        self.ckpt_s = self.save()  # also measures what the final save will take
        last_eval_t = win_t = time.perf_counter()
        win_steps, loss_sum = 0, torch.zeros((), device=self.device)
        while (reason := self.stop_reason()) is None:
            ts = time.perf_counter()
            lr = lr_at(cfg, st.step, self.elapsed(), self.reserve())
            loss, norm = self.train_step(lr)
            loss_sum += loss
            win_steps += 1
            if st.step > 3:  # the first steps compile; later ones are launch time until synced below
                self.step_s = time.perf_counter() - ts
            if st.step % cfg.log_every == 0:
                dt = time.perf_counter() - win_t
                self.log({"step": st.step, "loss": round(float(loss_sum) / win_steps, 4), "lr": round(lr, 7),
                          "grad_norm": round(float(norm), 3) if norm is not None else None,
                          "tok_s": round(win_steps * self.tokens_per_step / dt),
                          "elapsed": round(self.elapsed(), 1), "tokens": st.step * self.tokens_per_step,
                          "epoch": round(self.sampler.epoch, 3)})
                self.step_s = dt / win_steps
                win_t, win_steps, loss_sum = time.perf_counter(), 0, torch.zeros((), device=self.device)
            tp = time.perf_counter()
            if (cfg.eval_every and st.step % cfg.eval_every == 0) or (
                    cfg.eval_every_s and tp - last_eval_t >= cfg.eval_every_s):
                self.run_eval()
                last_eval_t = time.perf_counter()
            if cfg.ckpt_every and st.step % cfg.ckpt_every == 0:
                self.ckpt_s = self.save()
                self.log({"event": "checkpoint", "step": st.step, "path": str(self.out / "ckpt"),
                          "save_s": round(self.ckpt_s, 1)})
            win_t += time.perf_counter() - tp  # tokens/s counts training time only
        if self.evaluated_at != st.step:
            self.run_eval()
        self.save()
        final = {"event": "done", "reason": reason, "step": st.step, "eval_loss": round(st.eval_loss, 4),
                 "best_eval_loss": round(st.best_eval, 4), "elapsed": round(self.elapsed(), 1),
                 "tokens": st.step * self.tokens_per_step, "epoch": round(self.sampler.epoch, 3),
                 "params": self.model.num_params(), "ckpt_bytes": folder_bytes(self.out / "ckpt"),
                 "ckpt": str(self.out / "ckpt")}
        self.log(final)
        return final


def load_init(path: str, tok_sha: str) -> Transformer:
    """The dense fp32 model of a tinyllm checkpoint folder trained with the same tokenizer."""
    from tinyllm.formats.checkpoint import load_checkpoint

    ck = load_checkpoint(path, "cpu", torch.float32, quant="none")
    if not hasattr(ck.tokenizer, "serialized") or hashlib.sha256(ck.tokenizer.serialized()).hexdigest() != tok_sha:
        raise ValueError(f"--init {path} holds another tokenizer than --tokenizer; pass the one it was made with")
    return ck.model


def train_model(cfg: TrainConfig) -> dict:
    """Train (or resume) one run; returns the final log record."""
    return Trainer(cfg).run()


# ---- the CLI --------------------------------------------------------------------------

def _field_comments() -> dict[str, str]:
    """TrainConfig's per-field comments, as --help text."""
    src = inspect.getsource(TrainConfig)
    return {m[1]: m[2] for m in re.finditer(r"^\s+(\w+): [^#\n]*# (.*)$", src, re.M)}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tinyllm train", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("tokenizer", help="train the sentencepiece tokenizer")
    t.add_argument("--data", default="data/tinychat-distill")
    t.add_argument("--out", required=True, help="folder for tokenizer.model")
    t.add_argument("--vocab-size", type=int, default=8192)
    t.add_argument("--sample", type=int, default=100_000, help="conversations to train on")
    t.add_argument("--template", default="chatml")
    t.add_argument("--eval-per-mille", type=int, default=10)
    k = sub.add_parser("tokenize", help="tokenize the data into the cache (the model step does it too)")
    k.add_argument("--tokenizer", required=True)
    k.add_argument("--data", default="data/tinychat-distill")
    k.add_argument("--cache-dir", default="data/cache")
    k.add_argument("--template", default="chatml")
    k.add_argument("--eval-per-mille", type=int, default=10)
    k.add_argument("--workers", type=int, default=0)
    m = sub.add_parser("model", help="train a model")
    helps = _field_comments()
    for f in fields(TrainConfig):
        flag, h = "--" + f.name.replace("_", "-"), helps.get(f.name)
        if f.name == "tie_embeddings":
            m.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=h)
        elif f.type == "bool":
            m.add_argument(flag, action="store_true", help=h)
        else:
            kind = {"int": int, "float": float}.get(str(f.type).split(" ")[0], str)
            required = f.name in ("out", "tokenizer")
            m.add_argument(flag, type=kind, required=required, default=None if required else f.default,
                           help=h if required else f"{h or ''} (default: {f.default})")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.cmd == "tokenizer":
            t0 = time.perf_counter()
            path = data.train_tokenizer(args.data, args.out, args.vocab_size, args.sample, args.template,
                                        args.eval_per_mille)
            log(None, {"event": "tokenizer", "path": str(path), "vocab_size": Tokenizer.load(path).vocab_size,
                       "seconds": round(time.perf_counter() - t0, 1)})
        elif args.cmd == "tokenize":
            tokenize(args.tokenizer, args.data, args.cache_dir, args.template, args.eval_per_mille,
                     args.workers)
        else:
            cfg = TrainConfig(**{f.name: getattr(args, f.name) for f in fields(TrainConfig)})
            train_model(cfg)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
