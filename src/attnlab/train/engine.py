"""The generic training loop shared by every task (classifier, GPT LM, translation, ViT).

Batching contract
  * `data.batches(epoch)` returns GLOBAL micro-batches of dataset indices (all ranks together).
  * One optimizer step consumes `cfg.grad_accum` consecutive micro-batches; the last step of an
    epoch may consume fewer (nothing is dropped). Global batch per step = batch_size * grad_accum.
  * Under torchrun each micro-batch is sharded as `indices[rank::world_size]`. A rank whose shard
    is empty runs its first index with weight 0, so DDP's collectives still line up.

Gradient weighting (exact)
  Each micro-batch's step_fn returns the MEAN loss over `weight` units. The engine backpropagates
  `loss * weight`, sums the weights over micro-batches and ranks (all-reduce) into W, and scales
  the gradients by world_size / W (DDP averages over ranks). The update therefore equals one
  process taking the mean over every unit of the global batch.

Evaluation runs on rank 0 only (on the unwrapped model, in eval mode, under no_grad/autocast);
its result is broadcast so every rank takes the same early-stopping decision. The other ranks
wait in that broadcast, so one evaluation must finish within the process-group timeout. Metrics,
checkpoints, best weights, TensorBoard, curves.png and summary.json are written by rank 0.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from tqdm.auto import tqdm

from attnlab.configs import save_json, to_dict
from attnlab.errors import UserError
from attnlab.train.checkpoint import (
    load_checkpoint,
    read_trainer_state,
    recover_state_dir,
    save_checkpoint,
    save_weights,
)
from attnlab.train.config import TrainConfig
from attnlab.train.data import StepOutput, TrainData
from attnlab.train.distributed import (
    DistEnv,
    broadcast_object,
    cleanup,
    gather_objects,
    init_distributed,
    shard,
    wrap_ddp,
)
from attnlab.train.meter import LoopState, WeightedSums
from attnlab.train.metrics_log import MetricsLog, truncate_metrics
from attnlab.train.optim import describe_groups, make_optimizer
from attnlab.train.precision import (
    PRECISION_DTYPES,
    autocast,
    autocast_off,
    choose_by_step_time,
    choose_precision,
    configure_tf32,
    make_grad_scaler,
    precision_name,
    restore_tf32,
    step_timing,
    synchronizer,
    tf32_flags,
    time_step_precisions,
)
from attnlab.train.precision_record import (
    device_description,
    read_record,
    record_path,
    setting_key,
    write_record,
)
from attnlab.train.rng import capture_rng, restore_rng, seed_everything
from attnlab.train.schedules import lr_factor, resolve_warmup

StepFn = Callable[[nn.Module, dict], StepOutput]
EvalFn = Callable[[nn.Module], dict[str, float]]


def _log(msg: str) -> None:
    """One status line on stderr."""
    print(f"[attnlab] {msg}", file=sys.stderr, flush=True)


class Trainer:
    """Runs `step_fn` over `data` with AdamW or Muon+AdamW, a schedule, clipping, eval,
    checkpoints and DDP.

    `step_fn(model, batch)` receives the (possibly DDP-wrapped) model and a collated batch on
    `device`; call the model through it (use `attnlab.train.unwrap` for attributes).
    `evaluate(model)` receives the unwrapped model and returns metrics such as
    {"val_loss": ..., "val_acc": ...}; `cfg.monitor` must be one of its keys.
    Train events in metrics.jsonl carry the weighted mean loss/metrics since the previous event,
    the lr and the global gradient norm (before clipping) of the latest step, and tokens/s.
    Outputs in `run_dir`: metrics.jsonl, tensorboard/, state/ (resumable checkpoint),
    model.safetensors (best weights by `cfg.monitor`, or the last weights without `evaluate`),
    train_config.json, summary.json and curves.png.
    """

    def __init__(
        self,
        model: nn.Module,
        cfg: TrainConfig,
        run_dir: str | Path,
        data: TrainData,
        step_fn: StepFn,
        evaluate: EvalFn | None = None,
        device: str | torch.device = "cpu",
    ) -> None:
        """Store the pieces; nothing runs until `fit`."""
        if not isinstance(cfg, TrainConfig):
            raise ValueError(f"cfg must be a TrainConfig, got {type(cfg).__name__}")
        if not all(callable(getattr(data, name, None)) for name in ("batches", "collate")):
            raise ValueError("data must provide batches(epoch) and collate(indices); see TrainData")
        if cfg.target_loss > 0 and evaluate is None:
            raise ValueError("target_loss needs an evaluate function; pass evaluate= or set it 0")
        self.model = model
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.data = data
        self.step_fn = step_fn
        self.evaluate = evaluate
        self.device = torch.device(device)

    # ---------------------------------------------------------------- public entry point

    def fit(self, resume: bool = False) -> dict[str, Any]:
        """Train to completion (or early stop) and return a summary dict.

        With `resume=True`, continue from `run_dir/state/` exactly where it stopped (a fresh
        start if there is none). Without it, `run_dir` must not hold a previous run. On Ctrl-C
        a single-process run writes a checkpoint of the last completed step, then re-raises.
        `cfg.num_threads` and the TF32 flags (CUDA) apply for the duration of the call only.
        """
        threads, tf32 = torch.get_num_threads(), tf32_flags()
        if self.cfg.num_threads > 0:
            torch.set_num_threads(self.cfg.num_threads)
        env = init_distributed(self.device)
        try:
            summary = self._fit(env, resume)
        except BaseException:
            cleanup(env, wait=False)  # other ranks may never reach a barrier; torchrun ends them
            raise
        finally:
            torch.set_num_threads(threads)
            restore_tf32(tf32)
        cleanup(env)
        return summary

    # ---------------------------------------------------------------- setup

    def _fit(self, env: DistEnv, resume: bool) -> dict[str, Any]:
        """`fit` once the process group (if any) exists."""
        cfg, run_dir = self.cfg, self.run_dir
        self.env = env
        self.model.to(env.device)
        self.tf32 = configure_tf32(env.device, cfg.precision)  # before timing: fp32 uses it
        if env.is_main and env.device.type == "cuda":
            _log(self.tf32)
        dtype, reason = broadcast_object(
            self._decide_precision(resume) if env.is_main else None, env
        )
        self.dtype, self.precision, self.precision_reason = dtype, precision_name(dtype), reason
        if env.is_main:
            _log(f"precision {self.precision}: {reason}")
        self.optimizer = make_optimizer(self.model, cfg)
        if env.is_main and cfg.optimizer == "muon":
            _log(describe_groups(self.optimizer))
        self.scaler = make_grad_scaler(env.device, dtype)
        self.total_steps = self._count_total_steps()
        self.warmup = resolve_warmup(cfg.warmup_steps, cfg.warmup_ratio, self.total_steps)
        state = self._start_state(resume)
        if state.stop_reason is not None:
            if env.is_main:
                _log(
                    f"run in {run_dir} already finished ({state.stop_reason}); nothing to do "
                    "(train further in a new run_dir)"
                )
            return self._summary(state)
        self.log: MetricsLog | None = None
        if env.is_main:
            run_dir.mkdir(parents=True, exist_ok=True)
            save_json(cfg, run_dir / "train_config.json")
            truncate_metrics(run_dir / "metrics.jsonl", state.step)
            self.log = MetricsLog(run_dir, cfg.tensorboard, purge_step=state.step + 1)
        self.ddp_model = wrap_ddp(self.model, env)
        try:
            state = self._loop(state)
        finally:
            if self.log is not None:
                self.log.close()
        summary = self._summary(state)
        if env.is_main:
            (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
            try:
                from attnlab.train.curves import plot_curves  # matplotlib is slow to import
            except ImportError as err:
                _log(f"matplotlib is unusable ({err}); skipping curves.png")
            else:
                plot_curves(run_dir / "metrics.jsonl", run_dir / "curves.png")
        return summary

    def _decide_precision(self, resume: bool) -> tuple[torch.dtype | None, str]:
        """The autocast dtype and why. ``auto``: fp32 where the device has no low precision
        worth trying; else the choice recorded for this device, torch, thread count, model and
        micro-batch shape by an earlier start, or, the first time, this model's own step timed
        in fp32 and in the candidate (the faster kept) and recorded for the next start
        (:mod:`attnlab.train.precision_record`). A resumed run keeps its first choice (unless it
        was fp16 and this device is not CUDA)."""
        cfg, device = self.cfg, self.env.device
        note = ""
        if cfg.precision == "auto" and resume:
            trainer_state = read_trainer_state(self.run_dir)
            saved = trainer_state.get("precision") if trainer_state else None
            if saved == "fp16" and device.type != "cuda":
                note = "; the run's first start chose fp16, which needs CUDA"
            elif saved is not None:
                return PRECISION_DTYPES[saved], f"auto -> {saved}: kept from the run's first start"
        dtype, reason = choose_precision(device, cfg.precision)
        if cfg.precision != "auto" or dtype is None:
            return dtype, reason + note
        low = precision_name(dtype)
        why = reason.removeprefix(f"auto -> {low}: ")
        batch = self._probe_batch()
        key = setting_key(device_description(device), self.model, batch)
        entry, unreadable = read_record(key, ("fp32", low))  # what auto may pick here
        if entry is not None:
            chosen = entry["precision"]
            return PRECISION_DTYPES[chosen], (
                f"auto -> {chosen}: {why}; this setting's step was timed on {entry['date']} "
                f"({entry['timing']}), recorded in {record_path()}{note}"
            )
        _log(f"precision auto: timing one training step in fp32 and in {low}")
        seconds = time_step_precisions(self._probe_step(batch), ("fp32", low),
                                       sync=synchronizer(device))  # fmt: skip
        chosen_dtype, reason = choose_by_step_time(seconds, why, low)
        if math.isfinite(seconds[low]):  # a step that failed in `low` is not a measurement
            where = write_record(
                key,
                {
                    "precision": precision_name(chosen_dtype),
                    "timing": step_timing(seconds, low),
                    "date": time.strftime("%Y-%m-%d %H:%M"),
                },
            )
            reason = f"{reason}; {where}"
        if unreadable:
            reason = f"{reason} ({unreadable})"
        return chosen_dtype, reason + note

    def _probe_batch(self) -> dict:
        """The first micro-batch of the run, on the device: the batch ``auto`` times."""
        return self._to_device(self.data.collate(self.data.batches(0)[0]))

    def _probe_step(self, batch: dict) -> Callable[[torch.dtype | None], None]:
        """fwd+bwd of ``batch`` under a given autocast dtype, leaving the model as it was:
        gradients cleared, buffers (e.g. BatchNorm statistics) restored."""
        buffers = [(b, b.detach().clone()) for b in self.model.buffers()]

        def run(dtype: torch.dtype | None) -> None:
            self.model.train()
            try:
                with autocast(self.env.device, dtype):
                    out = self.step_fn(self.model, batch)
                out.loss.backward()
            finally:  # also when the step fails under this dtype (the probe then drops it)
                self.model.zero_grad(set_to_none=True)
                with torch.no_grad():
                    for buf, saved in buffers:
                        buf.copy_(saved)

        return run

    def _count_total_steps(self) -> int:
        """Optimizer steps in the whole run (for the lr schedule and the progress bar)."""
        if self.cfg.max_steps > 0:
            return self.cfg.max_steps
        total = 0
        for epoch in range(self.cfg.epochs):
            n = len(self.data.batches(epoch))
            if n == 0:
                raise ValueError(f"data.batches({epoch}) is empty; the dataset has no batches")
            total += math.ceil(n / self.cfg.grad_accum)
        return total

    def _start_state(self, resume: bool) -> LoopState:
        """Fresh, seeded state; or the checkpoint's, with weights, optimizer and RNG restored."""
        env, run_dir = self.env, self.run_dir
        found = None
        if env.is_main:  # rank 0 looks (and repairs) before it creates anything; others follow
            found = (recover_state_dir(run_dir) is not None, (run_dir / "metrics.jsonl").exists())
        has_ckpt, has_metrics = broadcast_object(found, env)
        if not resume:
            if has_ckpt or has_metrics:
                raise UserError(
                    f"{run_dir} already holds a run; continue it with --resume "
                    "or choose another --out"
                )
            seed_everything(self.cfg.seed + env.rank)
            return LoopState()
        if not has_ckpt:
            if env.is_main:
                _log(f"no checkpoint in {run_dir / 'state'}; starting from scratch")
            seed_everything(self.cfg.seed + env.rank)
            return LoopState()
        saved, rng_states = load_checkpoint(run_dir, self.model, self.optimizer)
        if self.scaler is not None and saved.get("scaler"):
            self.scaler.load_state_dict(saved["scaler"])
        if saved["world_size"] != env.world_size:
            raise UserError(
                f"checkpoint was written by {saved['world_size']} processes but this job has "
                f"{env.world_size}; resume with --nproc_per_node={saved['world_size']}"
            )
        restore_rng(rng_states[env.rank])
        state = LoopState.from_dict(saved["loop"])
        if state.stop_reason is not None and can_continue(state, self.cfg):
            state.stop_reason = None  # a finished run whose limits the resume raised goes on
        if env.is_main:
            _log(f"resuming from step {state.step} (epoch {state.epoch}, batch {state.batch_pos})")
            now = to_dict(self.cfg)
            changed = [
                f"{k}: {v} -> {now.get(k)}" for k, v in saved["config"].items() if now.get(k) != v
            ]
            if changed:
                _log(
                    "config differs from the checkpoint's (exact resume not guaranteed): "
                    + "; ".join(changed)
                )
        return state

    # ---------------------------------------------------------------- the loop

    def _loop(self, state: LoopState) -> LoopState:
        """Run optimizer steps until the run finishes; checkpoint on Ctrl-C (single process)."""
        cfg, env = self.cfg, self.env
        self._t0, self._base_elapsed = time.perf_counter(), state.elapsed_s
        self._c0, self._base_cpu = time.process_time(), state.cpu_s
        self._window_t0 = self._t0
        self._last_plain_log = self._t0
        boundary = (copy.deepcopy(state), capture_rng())  # state after the last finished step
        updating = False
        bar = tqdm(
            total=self.total_steps,
            initial=state.step,
            unit="step",
            file=sys.stderr,
            dynamic_ncols=True,
            disable=None if env.is_main else True,
        )
        signals = _DeferredSignals(active=not env.distributed)
        try:
            while state.stop_reason is None:
                batches = self.data.batches(state.epoch)
                if not batches:
                    raise ValueError(f"data.batches({state.epoch}) is empty")
                while True:
                    group = batches[state.batch_pos : state.batch_pos + cfg.grad_accum]
                    sums = self._accumulate(group)
                    updating = signals.busy = True
                    lr, grad_norm = self._update(state.step + 1, sums.weights["loss"])
                    epoch = state.epoch
                    state.step += 1
                    state.batch_pos += len(group)
                    epoch_done = state.batch_pos >= len(batches)
                    if epoch_done:
                        state.epoch, state.batch_pos = state.epoch + 1, 0
                    self._after_step(state, sums, lr, grad_norm, epoch, epoch_done, bar)
                    boundary = (copy.deepcopy(state), capture_rng())
                    updating = False
                    signals.done()  # a SIGINT/SIGTERM that came during the update stops here
                    if epoch_done or state.stop_reason is not None:
                        break
        except KeyboardInterrupt:
            if env.distributed or updating:
                why = "distributed run" if env.distributed else "interrupted mid-update"
                _log(f"interrupted ({why}); resume from the last periodic checkpoint")
            else:
                saved_state, rng = boundary
                saved_state.elapsed_s, saved_state.cpu_s = self._elapsed(), self._cpu()
                save_checkpoint(
                    self.run_dir,
                    self.model,
                    self.optimizer,
                    self._checkpoint_payload(saved_state),
                    [rng],
                )
                _log(
                    f"interrupted; checkpoint of step {saved_state.step} written to "
                    f"{self.run_dir / 'state'}"
                )
            raise
        finally:
            signals.restore()
            bar.close()
        state.elapsed_s, state.cpu_s = self._elapsed(), self._cpu()
        return state

    def _accumulate(self, group: list[list[int]]) -> WeightedSums:
        """Forward/backward each micro-batch of one optimizer step; return sums over all ranks."""
        env, model = self.env, self.ddp_model
        model.train()
        sums = WeightedSums()
        num_tokens = getattr(self.data, "num_tokens", None)
        # One autocast context spans the step's micro-batches: autocast keeps its low-precision
        # copy of each weight until its outermost context exits, so every weight is cast once a
        # step, not once a micro-batch. Each backward pass runs with autocast off, as outside
        # it; that context is nested, so the cache survives it.
        with autocast(env.device, self.dtype):
            for i, global_indices in enumerate(group):
                indices = shard(global_indices, env)
                empty = not indices
                batch = self._to_device(self.data.collate(indices or global_indices[:1]))
                sync = i == len(group) - 1 or not env.distributed
                with contextlib.nullcontext() if sync else model.no_sync():
                    out = self.step_fn(model, batch)
                    weight = _check_output(out)
                    if empty:  # this rank's stand-in item only keeps DDP's collectives in step
                        weight = 0.0
                    scaled = out.loss * weight  # sum of the unit losses; backward: summed grads
                    with autocast_off(env.device, self.dtype):
                        (self.scaler.scale(scaled) if self.scaler else scaled).backward()
                sums.add("loss", out.loss.item(), weight)
                for name, value in out.metrics.items():
                    sums.add(name, float(value), weight)
                if not empty:
                    sums.tokens += num_tokens(batch) if num_tokens else len(indices)
        sums.all_reduce(env)
        if not sums.weights["loss"] > 0:
            raise ValueError(
                "the total weight of an optimizer step is 0; StepOutput.weight must "
                "count the units (items or target tokens) the loss is averaged over"
            )
        return sums

    def _update(self, step: int, total_weight: float) -> tuple[float, float]:
        """Set the lrs, normalise and clip the gradients, step the optimizer; return (lr, grad
        norm), lr being the AdamW groups' (`cfg.lr` times the schedule factor). The schedule
        scales every group alike: Muon groups run at `cfg.muon_lr` times the same factor, and a
        group with an ``lr_scale`` (layer-wise decay) at that times its scale."""
        cfg = self.cfg
        factor = lr_factor(
            self._schedule_step(step),
            schedule=cfg.schedule,
            total_steps=self.total_steps,
            warmup_steps=self.warmup,
            min_lr_ratio=cfg.min_lr_ratio,
            noam_d_model=cfg.noam_d_model,
            decay_ratio=cfg.decay_ratio,
        )
        lr = cfg.lr * factor
        for group in self.optimizer.param_groups:
            base = cfg.muon_lr * factor if group.get("use_muon") else lr
            group["lr"] = base * group.get("lr_scale", 1.0)  # layer-wise decay (param_groups)
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        factor = self.env.world_size / total_weight  # DDP already divided by world_size
        for g in grads:
            g.mul_(factor)
        if cfg.clip_norm > 0:
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.clip_norm)
        else:
            norm = torch.nn.utils.get_total_norm(grads)
        grad_norm = float(norm)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        elif not math.isfinite(grad_norm):
            raise FloatingPointError(
                f"non-finite gradient norm at step {step}; lower lr or check the loss for nan/inf"
            )
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return lr, grad_norm

    def _schedule_step(self, step: int) -> int:
        """The step the lr schedule sees: `step`, or further on when the clock is ahead of it.

        With `schedule_by_time`, a run planned for `total_steps` but capped at `max_minutes`
        maps its fraction of the time budget onto the step axis, so warmup and decay fit the
        budget whichever comes first. Rank 0's clock decides for every rank.
        """
        cfg = self.cfg
        if not (cfg.schedule_by_time and cfg.max_minutes > 0):
            return step
        time_frac = broadcast_object(self._elapsed() / (60 * cfg.max_minutes), self.env)
        return max(step, min(self.total_steps, math.ceil(time_frac * self.total_steps)))

    def _after_step(
        self,
        state: LoopState,
        sums: WeightedSums,
        lr: float,
        grad_norm: float,
        epoch: int,
        epoch_done: bool,
        bar: tqdm,
    ) -> None:
        """Log, evaluate, early-stop and checkpoint after optimizer step `state.step`."""
        cfg, env = self.cfg, self.env
        state.window.merge(sums)
        if cfg.max_steps > 0:
            is_last = state.step >= cfg.max_steps
        else:
            is_last = epoch_done and epoch == cfg.epochs - 1
        out_of_time = False
        if cfg.max_minutes > 0 and not is_last:  # rank 0's clock decides for every rank
            out_of_time = broadcast_object(self._elapsed() >= 60 * cfg.max_minutes, env)
            is_last = out_of_time
        if state.step % cfg.log_every == 0 or is_last:
            self._log_train(state, lr, grad_norm, epoch, bar)
        periodic_eval = state.step % cfg.eval_every == 0 if cfg.eval_every else epoch_done
        do_eval = self.evaluate is not None and (
            is_last or (periodic_eval and state.step >= cfg.eval_start)
        )
        if do_eval:
            self._eval_and_track(state, epoch)
        if state.stop_reason is None and is_last:
            if out_of_time:
                state.stop_reason = "max_minutes"
            else:
                state.stop_reason = "max_steps" if cfg.max_steps > 0 else "epochs"
        finished = state.stop_reason is not None
        if finished and self.evaluate is None and env.is_main:
            save_weights(self.model, self.run_dir / "model.safetensors")
        periodic = cfg.checkpoint_every > 0 and state.step % cfg.checkpoint_every == 0
        if do_eval or periodic or finished:
            self._checkpoint(state)
        bar.update(1)

    def _log_train(
        self, state: LoopState, lr: float, grad_norm: float, epoch: int, bar: tqdm
    ) -> None:
        """Write one train event for the window since the last one, and reset the window."""
        now = time.perf_counter()
        means = state.window.means()
        tokens_per_s = state.window.tokens / max(now - self._window_t0, 1e-9)
        state.last_train_loss = means["loss"]
        record = {
            "step": state.step,
            "epoch": epoch,
            "split": "train",
            **means,
            "lr": lr,
            "grad_norm": grad_norm,
            "tokens_per_s": tokens_per_s,
            "elapsed_s": self._base_elapsed + now - self._t0,
            "precision": self.precision,
        }
        if self.log is not None:
            self.log.write(record)
        bar.set_postfix(loss=f"{means['loss']:.4f}", lr=f"{lr:.2e}", tok_s=f"{tokens_per_s:.0f}")
        if bar.disable and self.env.is_main and now - self._last_plain_log >= 30:
            # No terminal for the bar (a log file, CI): a plain progress line every 30 s.
            elapsed = record["elapsed_s"]
            done = max(state.step, 1)
            eta = elapsed / done * (self.total_steps - state.step) if self.total_steps else 0
            if self.cfg.max_minutes > 0:  # the time budget ends the run first
                eta = min(eta, max(0.0, 60 * self.cfg.max_minutes - elapsed))
            _log(
                f"step {state.step}/{self.total_steps} epoch {epoch} loss {means['loss']:.4f} "
                f"lr {lr:.2e} {tokens_per_s:.0f} tok/s elapsed {elapsed / 60:.1f} min "
                f"ETA {eta / 60:.1f} min"
            )
            self._last_plain_log = now
        state.window = WeightedSums()
        self._window_t0 = now

    def _eval_and_track(self, state: LoopState, epoch: int) -> None:
        """Evaluate on rank 0, save the best weights, and update early stopping on all ranks."""
        cfg, env = self.cfg, self.env
        eval_start, eval_cpu_start = time.perf_counter(), time.process_time()
        metrics = self._run_evaluate() if env.is_main else None
        metrics = broadcast_object(metrics, env)
        state.eval_s += time.perf_counter() - eval_start
        state.eval_cpu_s += time.process_time() - eval_cpu_start
        value = metrics[cfg.monitor]
        better = state.best_metric is None or (
            value < state.best_metric if cfg.monitor_mode == "min" else value > state.best_metric
        )
        improved = math.isfinite(value) and better
        if improved:
            state.best_metric, state.best_step, state.bad_evals = value, state.step, 0
            if env.is_main:
                save_weights(self.model, self.run_dir / "model.safetensors")
        else:
            state.bad_evals += 1
        if self.log is not None:
            self.log.write(
                {
                    "step": state.step,
                    "epoch": epoch,
                    "split": "val",
                    **metrics,
                    "best": improved,
                    "elapsed_s": self._elapsed(),
                    "precision": self.precision,
                }
            )
        if self._target_reached(value) and state.target_step is None:
            state.target_step = state.step
            state.target_time_s = self._elapsed() - state.eval_s
            state.target_cpu_s = self._cpu() - state.eval_cpu_s
            state.stop_reason = "target_loss"
            if env.is_main:
                _log(
                    f"target reached at step {state.step}: {cfg.monitor} {value:.4f} (target "
                    f"{cfg.target_loss}) after {state.target_time_s:.1f} s of training"
                )
        elif cfg.patience > 0 and state.bad_evals >= cfg.patience:
            state.stop_reason = "early_stop"
            if env.is_main:
                _log(
                    f"early stop at step {state.step}: {cfg.monitor} has not improved for "
                    f"{state.bad_evals} evals (best {state.best_metric} at {state.best_step})"
                )

    def _target_reached(self, value: float) -> bool:
        """Whether a monitor value reaches `cfg.target_loss` (0 = off) in `monitor_mode`."""
        target = self.cfg.target_loss
        if target <= 0 or not math.isfinite(value):
            return False
        return value <= target if self.cfg.monitor_mode == "min" else value >= target

    def _run_evaluate(self) -> dict[str, float]:
        """Call `evaluate` on the unwrapped model in eval mode; check the monitor key exists."""
        self.model.eval()
        with torch.no_grad(), autocast(self.env.device, self.dtype):
            metrics = {k: float(v) for k, v in self.evaluate(self.model).items()}
        self.model.train()
        if self.cfg.monitor not in metrics:
            raise UserError(
                f"monitor '{self.cfg.monitor}' is not among the evaluate() keys "
                f"{sorted(metrics)}; set TrainConfig.monitor to one of them"
            )
        return metrics

    def _checkpoint(self, state: LoopState) -> None:
        """Write `run_dir/state/` (rank 0), with every rank's RNG state gathered to it."""
        rng_states = gather_objects(capture_rng(), self.env)
        if self.env.is_main:
            snapshot = copy.deepcopy(state)
            snapshot.elapsed_s, snapshot.cpu_s = self._elapsed(), self._cpu()
            save_checkpoint(
                self.run_dir,
                self.model,
                self.optimizer,
                self._checkpoint_payload(snapshot),
                rng_states,
            )

    def _checkpoint_payload(self, state: LoopState) -> dict[str, Any]:
        """trainer.json contents: loop state, grad-scaler state, world size and config."""
        return {
            "loop": state.to_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "world_size": self.env.world_size,
            "precision": self.precision,
            "config": to_dict(self.cfg),
        }

    # ---------------------------------------------------------------- helpers

    def _cpu(self) -> float:
        """This process's CPU time in training (rank 0's view), including resumed processes."""
        return self._base_cpu + time.process_time() - self._c0

    def _elapsed(self) -> float:
        """Training wall time including earlier (resumed) processes."""
        return self._base_elapsed + time.perf_counter() - self._t0

    def _to_device(self, batch: dict) -> dict:
        """Move every tensor of a collated batch to the training device."""
        return {
            k: v.to(self.env.device, non_blocking=True) if isinstance(v, torch.Tensor) else v
            for k, v in batch.items()
        }

    def _summary(self, state: LoopState) -> dict[str, Any]:
        """The dict `fit` returns (also saved as summary.json)."""
        return {
            "monitor": self.cfg.monitor if self.evaluate is not None else None,
            "best_metric": state.best_metric,
            "best_step": state.best_step,
            "steps": state.step,
            "epochs": state.epoch,
            "final_train_loss": state.last_train_loss,
            "wall_time_s": state.elapsed_s,
            "eval_time_s": state.eval_s,
            "cpu_time_s": state.cpu_s,
            "eval_cpu_s": state.eval_cpu_s,
            "target_loss": self.cfg.target_loss or None,
            "target_reached": state.target_step is not None,
            "target_step": state.target_step,
            "target_time_s": state.target_time_s,
            "target_cpu_s": state.target_cpu_s,
            "precision": self.precision,
            "precision_reason": self.precision_reason,
            "tf32": self.tf32,
            "stop_reason": state.stop_reason,
            "world_size": self.env.world_size,
            "run_dir": str(self.run_dir),
        }


class _DeferredSignals:
    """SIGINT and SIGTERM stop a single-process run like Ctrl-C, but one that arrives during an
    optimizer update takes effect once the update (and its eval and checkpoint) is complete, so
    the checkpoint written on the way out is always of a finished step."""

    def __init__(self, active: bool) -> None:
        self.busy = self.pending = False
        self.saved: dict[int, Any] = {}
        if active and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.saved[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        if not self.busy:
            raise KeyboardInterrupt
        self.pending = True

    def done(self) -> None:
        self.busy = False
        if self.pending:
            self.pending = False
            raise KeyboardInterrupt

    def restore(self) -> None:
        for sig, handler in self.saved.items():
            signal.signal(sig, handler)


def can_continue(state: LoopState, cfg: TrainConfig) -> bool:
    """Whether a run that stopped (``state.stop_reason``) trains on under ``cfg``: it stopped at
    a step, epoch or time limit, or early, and ``cfg`` leaves steps, time and patience."""
    if state.stop_reason not in ("max_steps", "epochs", "max_minutes", "early_stop"):
        return False
    steps_left = state.step < cfg.max_steps if cfg.max_steps > 0 else state.epoch < cfg.epochs
    time_left = cfg.max_minutes <= 0 or state.elapsed_s < 60 * cfg.max_minutes
    patience_left = cfg.patience <= 0 or state.bad_evals < cfg.patience
    return steps_left and time_left and patience_left


def _check_output(out: StepOutput) -> float:
    """Validate a step function's output and return its weight."""
    if not isinstance(out, StepOutput):
        raise ValueError(f"step_fn must return a StepOutput, got {type(out).__name__}")
    if out.loss.ndim != 0 or not out.loss.requires_grad:
        raise ValueError(
            "StepOutput.loss must be a scalar tensor that requires grad "
            f"(got shape {tuple(out.loss.shape)}, requires_grad="
            f"{out.loss.requires_grad}); return the mean loss of the micro-batch"
        )
    weight = float(out.weight)
    if not (math.isfinite(weight) and weight >= 0):
        raise ValueError(f"StepOutput.weight must be a finite count >= 0, got {out.weight}")
    return weight
