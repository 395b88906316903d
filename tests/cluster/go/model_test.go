package main

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// op is a history entry: [call, ret] on client c.
func op(c int, call, ret int64, in kvInput, out kvOutput) porcupine.Operation {
	return porcupine.Operation{ClientId: c, Input: in, Output: out, Call: call, Return: ret}
}

func put(k int, v string) kvInput { return kvInput{Op: opPut, Key: k, Value: v} }
func get(k int) kvInput           { return kvInput{Op: opGet, Key: k} }
func del(k int) kvInput           { return kvInput{Op: opDelete, Key: k} }
func casMod(k int, mod int64, v string) kvInput {
	return kvInput{Op: opCAS, Key: k, ExpectMod: mod, Value: v}
}
func casVal(k int, old, v string) kvInput {
	return kvInput{Op: opCAS, Key: k, OnValue: true, ExpectValue: old, Value: v}
}
func at(rev int64) kvOutput { return kvOutput{Rev: rev} }
func saw(rev int64, v string, mod int64) kvOutput {
	return kvOutput{Rev: rev, Exists: true, Value: v, Mod: mod}
}
func absent(rev int64) kvOutput { return kvOutput{Rev: rev} }

var unknown = kvOutput{Unknown: true}

const never = 1 << 40 // an open-ended return time

func check(t *testing.T, exclusive bool, history []porcupine.Operation) porcupine.CheckResult {
	t.Helper()
	m := kvModel{exclusive: exclusive, keys: 2, initRev: 1}.porcupine()
	return porcupine.CheckOperationsTimeout(m, history, 0)
}

func TestModel(t *testing.T) {
	cases := []struct {
		name      string
		exclusive bool
		want      porcupine.CheckResult
		history   []porcupine.Operation
	}{
		{"sequential put get delete", true, porcupine.Ok, []porcupine.Operation{
			op(0, 0, 1, put(0, "a"), at(2)),
			op(0, 2, 3, get(0), saw(2, "a", 2)),
			op(0, 4, 5, del(0), kvOutput{Rev: 3, Deleted: 1}),
			op(0, 6, 7, del(0), kvOutput{Rev: 3}),
			op(0, 8, 9, get(0), absent(3)),
		}},
		{"stale read after a put returned", true, porcupine.Illegal, []porcupine.Operation{
			op(0, 0, 1, put(0, "a"), at(2)),
			op(1, 2, 3, get(0), absent(1)),
		}},
		{"concurrent read may miss the put", true, porcupine.Ok, []porcupine.Operation{
			op(0, 0, 10, put(0, "a"), at(2)),
			op(1, 2, 3, get(0), absent(1)),
			op(1, 4, 5, get(0), saw(2, "a", 2)),
		}},
		{"read goes back after seeing the put", true, porcupine.Illegal, []porcupine.Operation{
			op(0, 0, 10, put(0, "a"), at(2)),
			op(1, 2, 3, get(0), saw(2, "a", 2)),
			op(1, 4, 5, get(0), absent(1)),
		}},
		{"right value at a wrong revision", true, porcupine.Illegal, []porcupine.Operation{
			op(0, 0, 1, put(0, "a"), at(2)),
			op(0, 2, 3, put(1, "b"), at(3)),
			op(1, 4, 5, get(0), saw(2, "a", 2)),
		}},
		{"revision skipped by a foreign write: exclusive", true, porcupine.Illegal, []porcupine.Operation{
			op(0, 0, 1, put(0, "a"), at(2)),
			op(0, 2, 3, put(0, "b"), at(4)),
		}},
		{"revision skipped by a foreign write: monotone", false, porcupine.Ok, []porcupine.Operation{
			op(0, 0, 1, put(0, "a"), at(2)),
			op(0, 2, 3, put(0, "b"), at(4)),
			op(0, 4, 5, get(0), saw(7, "b", 4)),
		}},
		{"monotone still orders revisions", false, porcupine.Illegal, []porcupine.Operation{
			op(0, 0, 1, put(0, "a"), at(5)),
			op(0, 2, 3, put(1, "b"), at(4)),
		}},
		{"unknown put that took effect", true, porcupine.Ok, []porcupine.Operation{
			op(0, 0, never, put(0, "a"), unknown),
			op(1, 5, 6, get(0), saw(2, "a", 2)),
		}},
		{"unknown put that did not", true, porcupine.Ok, []porcupine.Operation{
			op(0, 0, never, put(0, "a"), unknown),
			op(1, 5, 6, get(0), absent(1)),
			op(1, 7, 8, put(1, "b"), at(2)),
		}},
		{"unknown put cannot take effect before its call", true, porcupine.Illegal, []porcupine.Operation{
			op(1, 0, 1, get(0), saw(2, "a", 2)),
			op(0, 5, never, put(0, "a"), unknown),
		}},
		{"unknown put in the monotone model: mod learned from the read", false, porcupine.Ok, []porcupine.Operation{
			op(0, 0, never, put(0, "a"), unknown),
			op(1, 5, 6, get(0), saw(9, "a", 8)),
			op(1, 7, 8, casMod(0, 8, "b"), kvOutput{Rev: 10, Succeeded: true}),
		}},
		{"cas on mod revision", true, porcupine.Ok, []porcupine.Operation{
			op(0, 0, 1, put(0, "a"), at(2)),
			op(0, 2, 3, casMod(0, 2, "b"), kvOutput{Rev: 3, Succeeded: true}),
			op(1, 4, 5, casMod(0, 2, "c"), kvOutput{Rev: 3, Exists: true, Value: "b", Mod: 3}),
			op(1, 6, 7, casMod(1, 0, "d"), kvOutput{Rev: 4, Succeeded: true}),
		}},
		{"cas succeeding on a stale mod revision", true, porcupine.Illegal, []porcupine.Operation{
			op(0, 0, 1, put(0, "a"), at(2)),
			op(0, 2, 3, put(0, "b"), at(3)),
			op(1, 4, 5, casMod(0, 2, "c"), kvOutput{Rev: 4, Succeeded: true}),
		}},
		{"cas on value, missing key never matches", true, porcupine.Illegal, []porcupine.Operation{
			op(0, 0, 1, casVal(0, "", "x"), kvOutput{Rev: 2, Succeeded: true}),
		}},
		{"cas on value", true, porcupine.Ok, []porcupine.Operation{
			op(0, 0, 1, put(0, "a"), at(2)),
			op(0, 2, 3, casVal(0, "a", "b"), kvOutput{Rev: 3, Succeeded: true}),
			op(0, 4, 5, casVal(0, "a", "c"), kvOutput{Rev: 3, Exists: true, Value: "b", Mod: 3}),
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := check(t, tc.exclusive, tc.history); got != tc.want {
				t.Fatalf("got %s, want %s", got, tc.want)
			}
		})
	}
}

func TestPausesAndRevisionOrder(t *testing.T) {
	acked := []ackedWrite{
		{"a", 10, 0.0, 0.1},
		{"b", 11, 0.1, 0.2},
		{"c", 12, 0.3, 1.5}, // 1.3 s without an acknowledgement
		{"d", 9, 1.6, 1.7},  // called after c was acknowledged at 12: backwards
		{"e", 12, 1.6, 1.8}, // the same revision as c (and so not above it)
	}
	r := result{}
	pauses(r, acked, 0, 2.0, 0.5)
	if got := r["longest_pause_s"].(float64); got < 1.29 || got > 1.31 {
		t.Fatalf("longest pause %v, want 1.3", got)
	}
	if got := len(r["pauses"].([][3]float64)); got != 1 {
		t.Fatalf("%d pauses above 0.5 s, want 1", got)
	}
	if v := revisionOrder(r, acked); v != 3 || r["revisions_backwards"] != 2 || r["duplicate_revisions"] != 1 {
		t.Fatalf("violations %d, %v", v, r)
	}
}

func TestHeaderOrder(t *testing.T) {
	// The run 1: client 3's put returned revision 4501, then its
	// failed CAS on another key reported 4500.
	inverted := []revOp{
		{What: "put(k0) -> @4501", Client: 3, Call: 1.0, Ret: 1.2, Rev: 4501},
		{What: "cas(k2) -> failed", Client: 3, Call: 1.3, Ret: 1.4, Rev: 4500},
		{What: "get(k1)", Client: 5, Call: 1.25, Ret: 1.5, Rev: 4499}, // another client, after the put too
	}
	n, samples := headerOrder(inverted)
	if n != 2 || len(samples) != 2 {
		t.Fatalf("inversions %d, samples %q; want 2", n, samples)
	}
	ok := []revOp{
		{What: "put(k0)", Client: 0, Call: 1.0, Ret: 2.0, Rev: 10},
		{What: "get(k1)", Client: 1, Call: 1.5, Ret: 1.6, Rev: 9},  // overlaps the put: may come before it
		{What: "get(k0)", Client: 1, Call: 2.5, Ret: 2.6, Rev: 10}, // equal revisions are in order
		{What: "cas(k1) -> failed", Client: 2, Call: 2.7, Ret: 2.8, Rev: 10},
		{What: "put(k1)", Client: 2, Call: 2.9, Ret: 3.0, Rev: 11},
	}
	if n, samples := headerOrder(ok); n != 0 {
		t.Fatalf("inversions %d in an ordered history: %q", n, samples)
	}
	r := result{}
	if got := orderInto(r, inverted); got != 2 || r["header_order_violations"] != 2 || r["header_order_checked"] != 3 {
		t.Fatalf("orderInto %d, %v", got, r)
	}
}

func TestPerKeyPartition(t *testing.T) {
	m := kvModel{exclusive: false, keys: 2, initRev: 1}.porcupine()
	m.Partition = partitionByKey
	// key 1's read at revision 2 after key 0's write at 3: stale across keys,
	// which the per-key check cannot see (headerOrder does) ...
	across := []porcupine.Operation{
		op(0, 0, 1, put(0, "a"), at(3)),
		op(1, 2, 3, get(1), absent(2)),
	}
	if got := porcupine.CheckOperations(m, across); !got {
		t.Fatalf("per key: a read of another key is checked against this key")
	}
	if n, _ := headerOrder([]revOp{{Rev: 3, Call: 0, Ret: 1}, {Rev: 2, Call: 2, Ret: 3}}); n != 1 {
		t.Fatalf("header order: %d inversions, want 1", n)
	}
	// ... while a stale read of the same key still fails.
	same := []porcupine.Operation{
		op(0, 0, 1, put(0, "a"), at(3)),
		op(1, 2, 3, get(0), absent(3)),
	}
	if porcupine.CheckOperations(m, same) {
		t.Fatalf("per key: a stale read of the key written passed")
	}
	if parts := partitionByKey(append(across, same...)); len(parts) != 2 || len(parts[0]) != 3 || len(parts[1]) != 1 {
		t.Fatalf("partitions %v", parts)
	}
}

func TestStopFile(t *testing.T) {
	c := newFlags("lin", time.Minute)
	c.stopFile = filepath.Join(t.TempDir(), "stop")
	deadline := time.Now().Add(time.Minute)
	c.watchStopFile(deadline)
	if !c.issuing(deadline) {
		t.Fatal("stopped before the stop file exists")
	}
	if err := os.WriteFile(c.stopFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for end := time.Now().Add(5 * time.Second); c.issuing(deadline); {
		if time.Now().After(end) {
			t.Fatal("still issuing 5 s after the stop file appeared")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if c.issuing(time.Now().Add(time.Hour)) {
		t.Fatal("issuing again")
	}
}
