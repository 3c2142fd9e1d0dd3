"""The selective scan as one fused CPU kernel, written by hand in C++.

The same function as :func:`attnlab.layers.ssm.selective_scan_sequential` (Gu & Dao 2023, eq. 2 with
zero-order hold on A and Euler on B): h_t = exp(Δ_t A) ⊙ h_{t−1} + Δ_t x_t B_t, y_t = C_t h_t,
from h0 (zeros when None), returning y (batch, T, D) and the last state h_T (batch, D, N).

The kernel keeps the state in cache and never writes it out. Per batch row and per tile of up
to 64 channels, the (N, tile) state lives in a local array and time runs in one loop; the inner
loop runs over the tile's channels (contiguous in x and Δ, so the compiler vectorises it, exp
included: glibc's vector exp, libmvec). The forward pass keeps only the state entering every
64 steps (T/64 states, not T). The backward pass, segment by segment from the end, recomputes
the segment's decays and states from there into a thread-local buffer and runs the adjoint
g_t = C_t ∂y_t + exp(Δ_{t+1} A) g_{t+1} backwards, accumulating ∂x, ∂Δ, ∂A, ∂B, ∂C and ∂h0.
Batch rows run in parallel (``at::parallel_for``): each row's ∂B and ∂C rows belong to it, and
∂A is summed over rows from per-row partials afterwards, so no two threads write one place.
float32 and float64 (the Mamba block already runs its scan in float32 at least, outside
autocast, so bf16/fp16 models reach it upcast).

It is compiled with ``torch.utils.cpp_extension.load_inline`` (-O3) on first use and cached in
torch's extensions directory (~75 s the first time). If the build fails (no compiler, no
libmvec), one line on stderr says so and why, and :mod:`attnlab.layers.ssm` runs its eager chunked
scan instead: the same function. ``ATTNLAB_EAGER_SCAN=1`` in the environment forces the eager
scan (read at every call).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import Tensor

EAGER_ENV = "ATTNLAB_EAGER_SCAN"
CALLS = [0]  # forward calls of the compiled scan so far (tests check the block uses it)

_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cmath>
#include <vector>
#include <algorithm>

constexpr int64_t W = 64;  // channels per tile
constexpr int64_t S = 64;  // time steps per segment of the backward pass

template <typename s>
void fwd_tile(const s* __restrict x, const s* __restrict dl, const s* __restrict At,
              const s* __restrict B, const s* __restrict C, s* __restrict h,
              s* __restrict y, s* __restrict du, s* __restrict yacc,
              int64_t T, int64_t D, int64_t N, int64_t d0, int64_t wn, s* __restrict keep) {
  // h (N, W) in: the state before, out: the state after; keep (ceil(T/S), N, W) or null:
  // the state entering every segment of S steps. y null: no output.
  for (int64_t t = 0; t < T; ++t) {
    if (keep && t % S == 0) std::copy(h, h + N * W, keep + (t / S) * N * W);
    const s* xr = x + t * D + d0;
    const s* dr = dl + t * D + d0;
    const s* Br = B + t * N;
    const s* Cr = C + t * N;
    for (int64_t w = 0; w < wn; ++w) { du[w] = dr[w] * xr[w]; yacc[w] = 0; }
    for (int64_t n = 0; n < N; ++n) {
      const s bn = Br[n], cn = Cr[n];
      const s* An = At + n * D + d0;
      s* hn = h + n * W;
      for (int64_t w = 0; w < wn; ++w) {
        hn[w] = std::exp(dr[w] * An[w]) * hn[w] + du[w] * bn;
        yacc[w] += cn * hn[w];
      }
    }
    if (y) {
      s* yr = y + t * D + d0;
      for (int64_t w = 0; w < wn; ++w) yr[w] = yacc[w];
    }
  }
}

std::vector<torch::Tensor> scan_fwd(torch::Tensor x, torch::Tensor dl, torch::Tensor At,
                                    torch::Tensor B, torch::Tensor C, torch::Tensor h0) {
  const int64_t b = x.size(0), T = x.size(1), D = x.size(2), N = At.size(0);
  const int64_t nseg = (T + S - 1) / S, ntile = (D + W - 1) / W;
  auto y = torch::empty_like(x);
  auto hT = torch::empty_like(h0);
  // the state entering every segment of S steps, per row and tile, for the backward pass
  auto keep = torch::empty({b, ntile, nseg, N, W}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "scan_fwd", [&] {
    using s = scalar_t;
    const s *xp = x.data_ptr<s>(), *dp = dl.data_ptr<s>(), *Ap = At.data_ptr<s>(),
            *Bp = B.data_ptr<s>(), *Cp = C.data_ptr<s>(), *h0p = h0.data_ptr<s>();
    s *yp = y.data_ptr<s>(), *hTp = hT.data_ptr<s>(), *kp = keep.data_ptr<s>();
    at::parallel_for(0, b, 1, [&](int64_t r0, int64_t r1) {
      std::vector<s> h(N * W), du(W), yacc(W);
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t d0 = 0; d0 < D; d0 += W) {
          const int64_t wn = std::min(W, D - d0);
          for (int64_t n = 0; n < N; ++n)
            for (int64_t w = 0; w < wn; ++w) h[n * W + w] = h0p[(r * D + d0 + w) * N + n];
          fwd_tile<s>(xp + r * T * D, dp + r * T * D, Ap, Bp + r * T * N, Cp + r * T * N,
                      h.data(), yp + r * T * D, du.data(), yacc.data(), T, D, N, d0, wn,
                      kp + (r * ntile + d0 / W) * nseg * N * W);
          for (int64_t n = 0; n < N; ++n)
            for (int64_t w = 0; w < wn; ++w) hTp[(r * D + d0 + w) * N + n] = h[n * W + w];
        }
      }
    });
  });
  return {y, hT, keep};
}

template <typename s>
inline void recompute_step(int64_t wn, const s* __restrict dr, const s* __restrict An,
                           const s* __restrict du, s bn, s* __restrict hn, s* __restrict an,
                           s* __restrict hsn) {
#pragma GCC ivdep
  for (int64_t w = 0; w < wn; ++w) {
    const s a = std::exp(dr[w] * An[w]);
    an[w] = a;
    hn[w] = a * hn[w] + du[w] * bn;
    hsn[w] = hn[w];
  }
}

template <typename s>
inline void adjoint_step(int64_t wn, const s* __restrict gyr, const s* __restrict hn,
                         const s* __restrict pn, const s* __restrict an, const s* __restrict An,
                         const s* __restrict xr, const s* __restrict dr, const s* __restrict du,
                         s bn, s cn, s* __restrict gn, s* __restrict gAn, s* __restrict dda,
                         s* __restrict dxa, s* __restrict out) {
  // g = ∂L/∂h_t (gn holds a_{t+1} g_{t+1}); out[0] += Σ_w ∂y·h_t (∂C), out[1] += Σ_w g Δx (∂B)
  s sc = 0, sb = 0;
#pragma GCC ivdep
  for (int64_t w = 0; w < wn; ++w) {
    sc += gyr[w] * hn[w];
    const s gv = gn[w] + cn * gyr[w];
    const s ga = gv * pn[w] * an[w];  // ∂L/∂(Δ A)
    dda[w] += ga * An[w] + gv * xr[w] * bn;
    gAn[w] += ga * dr[w];
    dxa[w] += gv * dr[w] * bn;
    sb += gv * du[w];
    gn[w] = an[w] * gv;
  }
  out[0] += sc;
  out[1] += sb;
}

template <typename s>
void bwd_tile(const s* __restrict x_, const s* __restrict d_, const s* __restrict Ap,
              const s* __restrict B_, const s* __restrict C_, const s* __restrict gy_,
              const s* __restrict keep, s* __restrict gx_, s* __restrict gd_,
              s* __restrict gB_, s* __restrict gC_, s* __restrict g, s* __restrict gAl,
              s* __restrict h, s* __restrict du, s* __restrict as, s* __restrict hs,
              s* __restrict dxa, s* __restrict dda, int64_t T, int64_t D, int64_t N,
              int64_t d0, int64_t wn) {
  // one row and tile: g (N, W) in: ∂L/∂h_T, out: ∂L/∂h0; gAl (N, W) += ∂A; gB, gC += theirs
  const int64_t nseg = (T + S - 1) / S;
  for (int64_t sg = nseg - 1; sg >= 0; --sg) {
    const int64_t t0 = sg * S, L = std::min(S, T - t0);
    // recompute the segment from the state entering it: decays a_t and states h_t, (L, N, W)
    std::copy(keep + sg * N * W, keep + (sg + 1) * N * W, h);
    for (int64_t j = 0; j < L; ++j) {
      const int64_t t = t0 + j;
      const s* xr = x_ + t * D + d0;
      const s* dr = d_ + t * D + d0;
      for (int64_t w = 0; w < wn; ++w) du[w] = dr[w] * xr[w];
      for (int64_t n = 0; n < N; ++n)
        recompute_step<s>(wn, dr, Ap + n * D + d0, du, B_[t * N + n], h + n * W,
                          as + (j * N + n) * W, hs + (j * N + n) * W);
    }
    // the adjoint, backwards through the segment
    for (int64_t j = L - 1; j >= 0; --j) {
      const int64_t t = t0 + j;
      const s* xr = x_ + t * D + d0;
      const s* dr = d_ + t * D + d0;
      const s* gyr = gy_ + t * D + d0;
      const s* prev = j > 0 ? hs + (j - 1) * N * W : keep + sg * N * W;
      for (int64_t w = 0; w < wn; ++w) { du[w] = dr[w] * xr[w]; dxa[w] = 0; dda[w] = 0; }
      for (int64_t n = 0; n < N; ++n) {
        s out[2] = {0, 0};
        adjoint_step<s>(wn, gyr, hs + (j * N + n) * W, prev + n * W, as + (j * N + n) * W,
                        Ap + n * D + d0, xr, dr, du, B_[t * N + n], C_[t * N + n], g + n * W,
                        gAl + n * W, dda, dxa, out);
        gC_[t * N + n] += out[0];
        gB_[t * N + n] += out[1];
      }
      s* gxr = gx_ + t * D + d0;
      s* gdr = gd_ + t * D + d0;
      for (int64_t w = 0; w < wn; ++w) { gxr[w] = dxa[w]; gdr[w] = dda[w]; }
    }
  }
}

std::vector<torch::Tensor> scan_bwd(torch::Tensor x, torch::Tensor dl, torch::Tensor At,
                                    torch::Tensor B, torch::Tensor C, torch::Tensor keep_,
                                    torch::Tensor gy, torch::Tensor gh) {
  const int64_t b = x.size(0), T = x.size(1), D = x.size(2), N = At.size(0);
  const int64_t nseg = (T + S - 1) / S, ntile = (D + W - 1) / W;
  auto gx = torch::empty_like(x), gd = torch::empty_like(x);
  auto gB = torch::zeros_like(B), gC = torch::zeros_like(C);
  auto gA = torch::empty({b, N, D}, x.options());  // per-row partials of ∂A (transposed)
  auto gh0 = torch::empty_like(gh);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "scan_bwd", [&] {
    using s = scalar_t;
    const s *xp = x.data_ptr<s>(), *dp = dl.data_ptr<s>(), *Ap = At.data_ptr<s>(),
            *Bp = B.data_ptr<s>(), *Cp = C.data_ptr<s>(), *gyp = gy.data_ptr<s>(),
            *ghp = gh.data_ptr<s>(), *kp = keep_.data_ptr<s>();
    s *gxp = gx.data_ptr<s>(), *gdp = gd.data_ptr<s>(), *gBp = gB.data_ptr<s>(),
      *gCp = gC.data_ptr<s>(), *gAp = gA.data_ptr<s>(), *gh0p = gh0.data_ptr<s>();
    at::parallel_for(0, b, 1, [&](int64_t r0, int64_t r1) {
      std::vector<s> h(N * W), du(W), g(N * W), gAl(N * W), dxa(W), dda(W);
      std::vector<s> as(S * N * W), hs(S * N * W);
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t d0 = 0; d0 < D; d0 += W) {
          const int64_t wn = std::min(W, D - d0);
          for (int64_t n = 0; n < N; ++n)
            for (int64_t w = 0; w < wn; ++w) {
              g[n * W + w] = ghp[(r * D + d0 + w) * N + n];
              gAl[n * W + w] = 0;
            }
          bwd_tile<s>(xp + r * T * D, dp + r * T * D, Ap, Bp + r * T * N, Cp + r * T * N,
                      gyp + r * T * D, kp + (r * ntile + d0 / W) * nseg * N * W,
                      gxp + r * T * D, gdp + r * T * D, gBp + r * T * N, gCp + r * T * N,
                      g.data(), gAl.data(), h.data(), du.data(), as.data(), hs.data(),
                      dxa.data(), dda.data(), T, D, N, d0, wn);
          for (int64_t n = 0; n < N; ++n)
            for (int64_t w = 0; w < wn; ++w) {
              gh0p[(r * D + d0 + w) * N + n] = g[n * W + w];
              gAp[(r * N + n) * D + d0 + w] = gAl[n * W + w];
            }
        }
      }
    });
  });
  return {gx, gd, gA.sum(0).t(), gB, gC, gh0};
}
"""

_LOCK = threading.Lock()
_STATE: dict[str, object] = {}  # "module": the built extension, or "error": why it is not


def _flags() -> list[str]:
    """-O3, fast math at compile time only (it lets GCC call libmvec's vector exp; the linker
    never sees it, so no flush-to-zero start-up code joins the process), OpenMP at compile time
    only (``at::parallel_for`` is OpenMP pragmas in torch's headers; the runtime is the one torch
    already loaded), AVX2 + FMA where torch finds them."""
    flags = ["-O3", "-ffast-math", "-fopenmp"]
    if torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"):
        flags += ["-mavx2", "-mfma"]
    return flags


def _build():
    """The extension module, built on first use (None when the build failed; said once)."""
    with _LOCK:
        if "module" in _STATE or "error" in _STATE:
            return _STATE.get("module")
        try:
            from torch.utils.cpp_extension import _get_build_directory, load_inline

            flags = _flags()
            name = "attnlab_scan_v1_" + ("avx2" if "-mavx2" in flags else "base")
            folder = Path(_get_build_directory(name, verbose=False))
            with builder_lock(folder):
                _say_if_compiling(folder, name)
                _STATE["module"] = load_inline(
                    name=name,
                    cpp_sources=_SOURCE,
                    functions=["scan_fwd", "scan_bwd"],
                    extra_cflags=flags,
                    extra_ldflags=["-lmvec"],
                )
        except Exception as e:  # noqa: BLE001 - any failure means: use the eager scan
            lines = [line for line in str(e).strip().splitlines() if line.strip()]
            why = f"{type(e).__name__}: {lines[-1] if lines else ''}"
            _STATE["error"] = why
            print(
                f"attnlab: the compiled selective scan is unavailable ({why}); "
                "using the eager chunked scan",
                file=sys.stderr,
            )
        return _STATE.get("module")


def _say_if_compiling(folder: Path, name: str) -> None:
    """One stderr line before a build that has no cached library yet (it takes about a minute
    on two cores), so the first Mamba run does not look stuck."""
    if not any(folder.glob(f"{name}*.so")):
        print(
            "attnlab: compiling the fused selective scan (first use only, about a minute)",
            file=sys.stderr,
            flush=True,
        )


TORCH_LOCK = "lock"  # torch's build baton: an empty file, created and removed by the builder
BUILDER = "attnlab.builder"  # an flock held by the attnlab process that builds or loads here


@contextlib.contextmanager
def builder_lock(folder: Path) -> Iterator[None]:
    """Hold an flock on ``folder/attnlab.builder`` while torch builds or loads the extension.

    torch's ``lock`` names no owner and outlives a killed builder, after which every later
    build waits on it forever. The kernel drops an flock when its process dies, so once this
    one is ours no live attnlab process is building here: a ``lock`` left now is stale, and it
    is removed (saying so)."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / BUILDER, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(
                "attnlab: waiting for another attnlab process building the fused selective scan",
                file=sys.stderr,
                flush=True,
            )
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            stale = folder / TORCH_LOCK
            if stale.exists():
                stale.unlink(missing_ok=True)
                print(
                    f"attnlab: removed a stale build lock {stale} (its builder was killed)",
                    file=sys.stderr,
                    flush=True,
                )
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def forced_eager() -> bool:
    """True when ``ATTNLAB_EAGER_SCAN=1`` asks for the eager scan."""
    return os.environ.get(EAGER_ENV, "").strip() == "1"


def available() -> bool:
    """Whether the compiled scan can run (building it on first call)."""
    return _build() is not None


def usable(x: Tensor) -> bool:
    """Whether the scan of ``x`` runs compiled: a CPU float32/float64 tensor, the kernel
    built, and the eager scan not forced."""
    return (
        x.device.type == "cpu"
        and x.dtype in (torch.float32, torch.float64)
        and not forced_eager()
        and available()
    )


class CompiledScan(torch.autograd.Function):
    """The fused kernel's forward and backward. x, delta (b, T, D); A (D, N); B, C (b, T, N);
    h0 (b, D, N), all of one dtype and contiguous -> y (b, T, D), h_T (b, D, N)."""

    @staticmethod
    def forward(ctx, x, delta, A, B, C, h0):
        mod = _build()
        A_t = A.t().contiguous()  # (N, D)
        y, h_last, keep = mod.scan_fwd(x, delta, A_t, B, C, h0)
        ctx.save_for_backward(x, delta, A_t, B, C, keep)
        CALLS[0] += 1
        return y, h_last

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, gy, gh):
        x, delta, A_t, B, C, keep = ctx.saved_tensors
        gy = torch.zeros_like(x) if gy is None else gy.contiguous()
        gh = x.new_zeros(x.shape[0], x.shape[2], A_t.shape[0]) if gh is None else gh.contiguous()
        gx, gd, gA, gB, gC, gh0 = _build().scan_bwd(x, delta, A_t, B, C, keep, gy, gh)
        return gx, gd, gA, gB, gC, gh0


def selective_scan_compiled(
    x: Tensor, delta: Tensor, A: Tensor, B: Tensor, C: Tensor, h0: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """The selective scan by the fused kernel; same shapes in and out as
    :func:`attnlab.layers.ssm.selective_scan_sequential` (the caller checks them). h0 None:
    zeros, and no gradient for it."""
    if h0 is None:
        h0 = x.new_zeros(x.shape[0], x.shape[2], A.shape[1])  # (b, D, N)
    dtype = x.dtype
    if any(t.dtype != dtype for t in (delta, A, B, C, h0)):
        raise ValueError("the compiled scan takes tensors of one dtype")
    args = [t.contiguous() for t in (x, delta, A, B, C, h0)]
    return CompiledScan.apply(*args)
