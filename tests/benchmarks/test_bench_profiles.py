"""The scale reads' profiles summarised (benchmarks/profiles.py), on canned profiler output (no servers)."""

from __future__ import annotations

from benchmarks import render
from benchmarks.profiles import OTHER, client_split, parse_raw, parse_traces, server_by_function

TRACES = """File: brainload
Type: cpu
Duration: 6.2s, Total samples = 2.20s (35.48%)
-----------+-------------------------------------------------------
     1.20s   runtime.memclrNoHeapPointers
             runtime.mallocgc
             google.golang.org/protobuf/internal/impl.consumeBytesNoZero
             google.golang.org/protobuf/proto.Unmarshal
             google.golang.org/grpc/encoding/proto.(*codecV2).Unmarshal
             google.golang.org/grpc.recv
-----------+-------------------------------------------------------
     500ms   runtime.scanobject
             runtime.gcDrain
             runtime.gcBgMarkWorker.func2
             runtime.gcBgMarkWorker
-----------+-------------------------------------------------------
     300ms   internal/runtime/syscall/linux.Syscall6
             syscall.read
             google.golang.org/grpc/internal/transport.(*http2Client).reader
-----------+-------------------------------------------------------
     200ms   internal/runtime/atomic.(*Pointer[go.shape.struct { a; b }]).StoreNoWB (inline)
             runtime.findRunnable
             runtime.schedule
-----------+-------------------------------------------------------
"""


def test_the_clients_cpu_is_split_into_decoding_gc_transport_and_the_rest():
    traces = parse_traces(TRACES)
    assert [round(v, 3) for v, _ in traces] == [1.2, 0.5, 0.3, 0.2]
    assert traces[3][1][0] == "internal/runtime/atomic.(*Pointer[go.shape.struct { a; b }]).StoreNoWB"
    split = client_split(traces)
    assert split["cpu_s"] == 2.2
    by = {c["class"]: (c["cpu_s"], c["share"]) for c in split["classes"]}
    # the zeroing under Unmarshal is decoding's, not the allocator's; the GC workers run beside it
    assert by["decoding"] == (1.2, 0.545) and by["garbage collection"] == (0.5, 0.227)
    assert by["gRPC transport and system calls"] == (0.3, 0.136) and by[OTHER] == (0.2, 0.091)


RAW = """thread (0x7f01): brain-front;Thread.run (threading.py:982);NativeFront._answer_reads (brain/api/native_front.py:522);KVService.range (brain/api/kv.py:70);range_response (brain/api/encoded.py:90) 30
thread (0x7f01): brain-front;Thread.run (threading.py:982);NativeFront._answer_reads (brain/api/native_front.py:522);KVService.range (brain/api/kv.py:71);Store.range_columns (brain/mvcc/store.py:157) 50
thread (0x7f02): committer;Thread.run (threading.py:982);Committer.loop (brain/engine/commit.py:40) 20
"""


def test_the_servers_samples_are_counted_by_function_own_and_with_what_it_called():
    stacks = parse_raw(RAW)
    assert stacks[0][0] == 30 and stacks[0][1] == "thread (0x7f01): brain-front"
    assert stacks[1][2][-2] == "KVService.range (brain/api/kv.py)"   # one function, whatever its line
    got = server_by_function(stacks, top=3)
    assert got["samples"] == 100
    assert got["self"][0] == {"function": "Store.range_columns (brain/mvcc/store.py)", "samples": 50, "share": 0.5}
    total = {x["function"]: x["samples"] for x in got["total"]}
    assert total["KVService.range (brain/api/kv.py)"] == 80 and "Thread.run (threading.py)" not in total
    assert [(t["thread"], t["samples"]) for t in got["threads"]] == [("brain-front", 80), ("committer", 20)]


def test_the_report_gives_a_profiled_reads_split_beside_its_row():
    profile = {"run": "a second run", "seconds": 6.1, "client_cpu_s": 2.3, "server_cpu_s": 4.9,
               "client": {**client_split(parse_traces(TRACES)),
                          "top": ["      flat  flat%   sum%        cum   cum%",
                                  "     1.20s 54.55% 54.55%      1.20s 54.55%  runtime.memclrNoHeapPointers"]},
               "server": server_by_function(parse_raw(RAW))}
    run = {"server": "brain", "workload": "scale-list-10000", "round": 1, "ok": True, "error": None,
           "result": {"keys_per_s": 60000.0, "ops": 400000, "profile": profile}, "cpu_s": 4.9, "cpu_us_per_op": 12.0}
    data = {"meta": {"started": "2026-01-01T00:00:00", "settings": {"rounds": 1, "name": "full"},
                     "machine": {"nproc": 2, "cpu": "x"}, "servers": {}, "tools": {}}, "runs": [run]}
    md = render.markdown(data, [])
    assert "the client's 2.20 s sampled: decoding 1.20 s (55%), garbage collection 0.500 s (23%)" in md
    assert "`runtime.memclrNoHeapPointers` 54.55%" in md
    assert "the server's 100 samples (py-spy, non-idle threads) by function, own: " \
           "`Store.range_columns (brain/mvcc/store.py)` 50%" in md
