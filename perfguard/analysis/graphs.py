"""Work replayed from a CUDA graph, tied to the launch that recorded it at capture time.

A replayed kernel's launching call is ``cudaGraphLaunch``; the op that issued
it ran during the capture. What a capture records depends on the profiler.
The PyTorch profiler of torch 2.11 (Kineto, CUPTI 13, real H200 trace
``tests/data/gpu_h200/graph_capture.pt.trace.json.gz``) writes:

* the capture's API calls on the capturing thread, inside the op ranges that
  issued them: ``cudaStreamBeginCapture``, one ``cudaLaunchKernel`` /
  ``cuLaunchKernelEx`` per kernel node (each with a correlation id that no
  kernel ever carries: nothing runs during a capture), ``cudaStreamEndCapture``,
  ``cudaGraphInstantiateWithFlags``;
* per replay one ``cudaGraphLaunch``, whose correlation id every replayed
  kernel and memop carries;
* no ``graph id`` or ``graph node id`` on any kernel, nor anything on
  ``cudaGraphLaunch`` that says which graph it launches.

So the tie is by order: a graph captured from one stream (no
``cudaStreamWaitEvent`` inside the capture, so no fork into branches) is a
chain, and its replay runs the nodes one after another in the order they were
recorded. A replay is tied to a capture only when nothing else fits: same
process, the capture ended before the replay was launched, the replay's
activities ran one after another, and it is the only such capture with as
many recorded launches as the replay has activities; then the k-th activity
(by start) is the k-th launch, provided each pairs a kernel with a kernel
launch and a memop with a memcpy/memset, and every replay tied to the capture
ran the same kernel names at each position. Anything short of that is left
untied (``graph_replay_<graph id>``), never guessed.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from perfguard.trace.nesting import group_codes

_SUFFIX = r"(?:_v\d+|_ptsz|_ptds)*$"
#: API-call kinds that matter for a capture, by name (runtime and driver API)
_KINDS = (
    (1, r"^cu(?:da)?StreamBeginCapture(?:ToGraph)?" + _SUFFIX),
    (2, r"^cu(?:da)?StreamEndCapture" + _SUFFIX),
    (
        3,
        r"^(?:cudaLaunchKernel(?:ExC)?|cudaLaunchCooperativeKernel|cuLaunchKernel(?:Ex)?"
        r"|cuLaunchCooperativeKernel)" + _SUFFIX,
    ),
    (4, r"^(?:cudaMemcpy\w*Async|cudaMemset\w*Async|cuMemcpy\w*Async|cuMemsetD\w*Async)" + _SUFFIX),
    (5, r"^cu(?:da)?StreamWaitEvent" + _SUFFIX),
)
_BEGIN, _END, _KERNEL_LAUNCH, _MEMOP_LAUNCH, _WAIT = 1, 2, 3, 4, 5


def _api_kinds(api: pd.DataFrame) -> np.ndarray:
    """Each API call's kind (:data:`_KINDS`, 0 for any other call), one match per name."""
    names = api["name"].astype("category").array
    kind_of = np.zeros(len(names.categories) + 1, dtype=np.int8)  # last: a missing name
    cats = pd.Series(names.categories, dtype=object).astype(str)
    for kind, pattern in _KINDS:
        kind_of[:-1][cats.str.match(pattern).to_numpy(dtype=bool)] = kind
    return kind_of[names.codes]


def recorded_launch(
    api: pd.DataFrame, acts: pd.DataFrame, launch: np.ndarray, replay: np.ndarray
) -> np.ndarray:
    """For each activity of ``acts``, the row of ``api`` that recorded it into the CUDA
    graph it was replayed from, -1 where untied (see the module docstring).

    ``launch``: each activity's launching call (a row of ``api``, -1 for none);
    ``replay``: whether that call replays a graph.
    """
    out = np.full(len(acts), -1, dtype=np.int64)
    if not replay.any() or not len(api):
        return out
    kind = _api_kinds(api)
    if not ((kind == _BEGIN).any() and (kind == _END).any()):
        return out  # no capture was profiled
    # the calls that matter, per thread in time order
    rows = np.flatnonzero(kind > 0)
    keys = api[["rank", "pid", "tid"]].iloc[rows].reset_index(drop=True)
    (thread,) = group_codes(keys)
    t = api["start"].to_numpy(np.int64)[rows]
    order = np.lexsort((t, thread))
    rows, thread, k = rows[order], thread[order], kind[rows][order]
    n = len(rows)
    idx = np.arange(n)
    mark = (k == _BEGIN) | (k == _END)
    last = np.maximum.accumulate(np.where(mark, idx, -1))  # latest marker so far
    marks = np.flatnonzero(mark)
    # a capture: a begin whose next marker on its thread is an end
    closed = np.zeros(n, dtype=bool)
    nxt = marks[1:]
    ok = (k[marks[:-1]] == _BEGIN) & (k[nxt] == _END) & (thread[nxt] == thread[marks[:-1]])
    closed[marks[:-1][ok]] = True
    end_row = np.full(n, -1, dtype=np.int64)
    end_row[marks[:-1][ok]] = rows[nxt[ok]]
    at = np.maximum(last, 0)
    inside = (last >= 0) & ~mark & closed[at] & (thread[at] == thread)
    # a wait on an event inside a capture forks it into branches: order says nothing
    branched = np.zeros(n, dtype=bool)
    branched[at[inside & (k == _WAIT)]] = True
    launches = inside & ((k == _KERNEL_LAUNCH) | (k == _MEMOP_LAUNCH))
    if not launches.any():
        return out
    cap = at[launches]  # the capture (its begin's position) of each recorded launch
    rec_row, rec_kind = rows[launches], k[launches]
    first = np.flatnonzero(np.r_[True, cap[1:] != cap[:-1]])  # contiguous per capture
    size = np.diff(np.r_[first, len(cap)])
    caps = pd.DataFrame(
        {
            "capture": np.arange(len(first)),
            "first": first,
            "n": size,
            "rank": api["rank"].to_numpy()[rows[cap[first]]],
            "pid": api["pid"].to_numpy()[rows[cap[first]]],
            "ended": api["end"].to_numpy(np.int64)[end_row[cap[first]]],
        }
    )[~branched[cap[first]]]

    # the replays: activities grouped by their cudaGraphLaunch, in start order
    act = np.flatnonzero(replay)
    act = act[
        np.lexsort(
            (
                acts["end"].to_numpy(np.int64)[act],
                acts["start"].to_numpy(np.int64)[act],
                launch[act],
            )
        )
    ]
    lr = launch[act]
    start = acts["start"].to_numpy(np.int64)[act]
    stop = acts["end"].to_numpy(np.int64)[act]
    head = np.flatnonzero(np.r_[True, lr[1:] != lr[:-1]])
    group = np.repeat(np.arange(len(head)), np.diff(np.r_[head, len(act)]))
    pos = np.arange(len(act)) - head[group]
    overlap = np.zeros(len(head), dtype=bool)  # a replay whose activities overlap
    inner = pos > 0
    np.logical_or.at(overlap, group[inner], start[inner] < stop[np.flatnonzero(inner) - 1])
    reps = pd.DataFrame(
        {
            "group": np.arange(len(head)),
            "n": np.diff(np.r_[head, len(act)]),
            "rank": api["rank"].to_numpy()[lr[head]],
            "pid": api["pid"].to_numpy()[lr[head]],
            "launched": api["start"].to_numpy(np.int64)[lr[head]],
        }
    )[~overlap]
    pairs = reps.merge(caps, on=["rank", "pid", "n"])
    pairs = pairs[pairs["ended"] <= pairs["launched"]]
    unique = pairs.groupby("group")["capture"].transform("size") == 1
    pairs = pairs[unique.to_numpy(dtype=bool)]
    capture_of = np.full(len(head), -1, dtype=np.int64)
    capture_of[pairs["group"].to_numpy()] = pairs["capture"].to_numpy()
    first_of = np.zeros(len(first), dtype=np.int64)
    first_of[caps["capture"].to_numpy()] = caps["first"].to_numpy()

    c = capture_of[group]
    tied = c >= 0
    rec = np.where(tied, first_of[np.maximum(c, 0)] + pos, 0)
    # each node's kind must match: a kernel to a kernel launch, a memop to a memcpy/memset
    is_kernel = acts["activity"].to_numpy(dtype=object)[act] == "kernel"
    wrong = tied & (is_kernel != (rec_kind[rec] == _KERNEL_LAUNCH))
    bad_group = np.zeros(len(head), dtype=bool)
    bad_group[group[wrong]] = True
    tied &= ~bad_group[group]
    # every replay of a capture ran the same kernel at each position
    name, _ = pd.factorize(acts["name"].to_numpy(dtype=object)[act])
    seen = pd.DataFrame({"node": rec[tied], "name": name[tied], "capture": c[tied]})
    varied = seen.groupby("node")["name"].transform("nunique").to_numpy() > 1
    bad_capture = np.unique(seen["capture"].to_numpy()[varied])
    tied &= ~np.isin(c, bad_capture)
    out[act[tied]] = rec_row[rec[tied]]
    return out
