package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

type mvccKV = mvccpb.KeyValue

// lin: --clients goroutines, each with its own client over every endpoint,
// issue get / put / CAS / delete on --keys keys for --duration; the history
// is then checked by porcupine against kvModel.
//
// Every put writes a value no other put writes, so a read names the write it
// saw. A CAS is Txn(If(key's mod revision or value == what this client last
// saw), Then(Put), Else(Get)): a kube-apiserver update. A failed read is left
// out of the history (it changed nothing); a failed write is an unknown
// outcome.

type linOp struct {
	client int
	in     kvInput
	out    kvOutput
	call   time.Time
	ret    time.Time
	from   answeredBy
}

// answeredBy is the response header's member and term: who answered, in
// which leader's term (for the problems a check lists, not for the model).
type answeredBy struct {
	member uint64
	term   uint64
}

func (a answeredBy) String() string { return fmt.Sprintf("member %x term %d", a.member, a.term) }

func runLin(args []string) (result, error) {
	c := newFlags("lin", 10*time.Second)
	clients := c.fs.Int("clients", 6, "concurrent clients, each with its own connection(s)")
	keys := c.fs.Int("keys", 3, fmt.Sprintf("keys operated on (1..%d)", maxKeys))
	rate := c.fs.Float64("rate", 0, "operations per second per client (0: as fast as answers come)")
	exclusive := c.fs.Bool("exclusive", true, "nothing else writes to the cluster: every write bumps the revision by exactly one (false: revisions only have to grow)")
	perKey := c.fs.Bool("per-key", false, "porcupine checks each key's history on its own (revisions only have to grow; the header order check still spans every key): for many clients and keys, where one history over all keys is too costly to check")
	checkTimeout := c.fs.Duration("check-timeout", 5*time.Minute, "porcupine's time limit; past it the result is check_result \"Unknown\" and the run fails")
	visual := c.fs.String("visualize", "", "write porcupine's HTML visualization here when the history is not linearizable")
	seed := c.fs.Uint64("seed", 0, "random seed (0: from the clock)")
	if err := c.parse(args); err != nil {
		return nil, err
	}
	if *keys < 1 || *keys > maxKeys {
		return nil, fmt.Errorf("%w: --keys must be in 1..%d", errUsage, maxKeys)
	}
	if *clients < 1 {
		return nil, fmt.Errorf("%w: --clients must be >= 1", errUsage)
	}
	if *seed == 0 {
		*seed = uint64(time.Now().UnixNano())
	}
	keyName := func(k int) string { return fmt.Sprintf("%sk%d", c.prefix, k) }

	conns, err := c.dialClients(*clients)
	if err != nil {
		return nil, err
	}
	defer closeAll(conns)
	// A clean slate: the history starts from "no key exists" at the
	// revision this delete returns.
	initRev, err := c.clearPrefix(conns[0])
	if err != nil {
		return nil, err
	}

	var errs errLog
	var mu sync.Mutex
	var ops []linOp
	start := time.Now()
	deadline := start.Add(c.duration)
	c.watchStopFile(deadline)
	var wg sync.WaitGroup
	for i := 0; i < *clients; i++ {
		wg.Add(1)
		go func(id int) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(*seed, uint64(id)))
			cli := conns[id]
			// What this client last saw of each key: CAS compares against it.
			lastMod := make([]int64, *keys)
			lastVal := make([]string, *keys)
			var mine []linOp
			seq := 0
			next := time.Now()
			for c.issuing(deadline) {
				if *rate > 0 {
					time.Sleep(time.Until(next))
					next = next.Add(time.Duration(float64(time.Second) / *rate))
				}
				k := rng.IntN(*keys)
				in := kvInput{Key: k}
				switch p := rng.IntN(100); {
				case p < 40:
					in.Op = opGet
				case p < 65:
					in.Op = opPut
				case p < 85:
					in.Op = opCAS
					in.OnValue = rng.IntN(4) == 0 && lastVal[k] != ""
					in.ExpectMod, in.ExpectValue = lastMod[k], lastVal[k]
				default:
					in.Op = opDelete
				}
				if in.Op == opPut || in.Op == opCAS {
					seq++
					in.Value = fmt.Sprintf("c%d-%d", id, seq)
				}
				op := linOp{client: id, in: in, call: time.Now()}
				ctx, cancel := c.ctx()
				out, from, err := doLinOp(ctx, cli, keyName(k), in)
				cancel()
				op.ret = time.Now()
				if err != nil {
					errs.add(in.Op.String(), err)
					if in.Op == opGet {
						continue
					}
					out = kvOutput{Unknown: true}
				}
				op.out, op.from = out, from
				mine = append(mine, op)
				switch {
				case out.Unknown:
				case in.Op == opPut || in.Op == opCAS && out.Succeeded:
					lastMod[k], lastVal[k] = out.Rev, in.Value
				case in.Op == opDelete:
					lastMod[k], lastVal[k] = 0, ""
				case out.Exists:
					lastMod[k], lastVal[k] = out.Mod, out.Value
				default:
					lastMod[k], lastVal[k] = 0, ""
				}
			}
			mu.Lock()
			ops = append(ops, mine...)
			mu.Unlock()
		}(i)
	}
	wg.Wait()
	runSeconds := time.Since(start).Seconds()

	history, counts := linHistory(ops, *clients)
	model := kvModel{exclusive: *exclusive && !*perKey, keys: *keys, initRev: initRev}.porcupine()
	if *perKey {
		model.Partition = partitionByKey
	}
	// Checked whatever porcupine says: a stale answer on a key that did not
	// change is linearizable per key but still out of real-time order.
	var answered []revOp
	for _, op := range ops {
		if !op.out.Unknown {
			answered = append(answered, revOp{What: describeInput(op.in) + " -> " + describeOutput(op.in, op.out) +
				" (" + op.from.String() + ")",
				Client: op.client, Call: since(op.call), Ret: since(op.ret), Rev: op.out.Rev})
		}
	}
	fmt.Fprintf(os.Stderr, "lin: %d operations (%d unknown) in %.1f s, checking...\n", len(history), counts["unknown"], runSeconds)
	t0 := time.Now()
	res := porcupine.CheckOperationsTimeout(model, history, *checkTimeout)
	checkSeconds := time.Since(t0).Seconds()
	r := result{
		"ops":           len(history),
		"ok":            counts["ok"],
		"unknown":       counts["unknown"],
		"by_op":         counts["by_op"],
		"clients":       *clients,
		"keys":          *keys,
		"exclusive":     *exclusive && !*perKey,
		"per_key":       *perKey,
		"seed":          *seed,
		"run_seconds":   runSeconds,
		"stopped_early": c.stopped.Load(),
		"check_result":  string(res),
		"check_seconds": checkSeconds,
		"violations":    0,
		"visualization": "",
	}
	errs.into(r)
	if counts["ok"] == 0 {
		return r, fmt.Errorf("no operation completed in %.1f s", runSeconds)
	}
	inversions := orderInto(r, answered)
	r["violations"] = inversions
	if inversions > 0 {
		fmt.Fprintf(os.Stderr, "lin: %d header revisions out of real-time order\n", inversions)
	}
	switch res {
	case porcupine.Illegal:
		r["violations"] = inversions + 1
		if *visual != "" {
			// The verbose check records the partial linearizations the
			// visualization draws; it is only worth its cost on a violation.
			_, info := porcupine.CheckOperationsVerbose(model, history, *checkTimeout)
			if err := porcupine.VisualizePath(model, info, *visual); err != nil {
				fmt.Fprintf(os.Stderr, "lin: writing the visualization: %v\n", err)
			} else {
				r["visualization"] = *visual
			}
		}
	case porcupine.Unknown:
		return r, fmt.Errorf("porcupine did not finish within --check-timeout %s", *checkTimeout)
	}
	return r, nil
}

// partitionByKey splits a history into one per key (porcupine's Partition).
func partitionByKey(history []porcupine.Operation) [][]porcupine.Operation {
	byKey := map[int][]porcupine.Operation{}
	var keys []int
	for _, op := range history {
		k := op.Input.(kvInput).Key
		if _, ok := byKey[k]; !ok {
			keys = append(keys, k)
		}
		byKey[k] = append(byKey[k], op)
	}
	out := make([][]porcupine.Operation, 0, len(keys))
	for _, k := range keys {
		out = append(out, byKey[k])
	}
	return out
}

// linHistory turns recorded operations into porcupine's history. An unknown
// outcome returns after everything else (open-ended: it may have taken
// effect at any time after its call) and is drawn on a row of its own, since
// its client went on with other operations meanwhile.
func linHistory(ops []linOp, clients int) ([]porcupine.Operation, map[string]any) {
	var end int64
	for _, op := range ops {
		end = max(end, op.ret.Sub(processStart).Nanoseconds())
	}
	end++
	byOp := map[string]int{}
	ok, unknown := 0, 0
	history := make([]porcupine.Operation, 0, len(ops))
	extraRow := clients
	for _, op := range ops {
		h := porcupine.Operation{
			ClientId: op.client,
			Input:    op.in,
			Output:   op.out,
			Call:     op.call.Sub(processStart).Nanoseconds(),
			Return:   op.ret.Sub(processStart).Nanoseconds(),
		}
		byOp[op.in.Op.String()]++
		if op.out.Unknown {
			h.Return = end
			h.ClientId = extraRow
			extraRow++
			unknown++
		} else {
			ok++
		}
		history = append(history, h)
	}
	return history, map[string]any{"ok": ok, "unknown": unknown, "by_op": byOp}
}

// doLinOp performs one operation; an error means the outcome is unknown.
func doLinOp(ctx context.Context, cli *clientv3.Client, key string, in kvInput) (kvOutput, answeredBy, error) {
	var out kvOutput
	var from answeredBy
	by := func(h *etcdserverpb.ResponseHeader) {
		from = answeredBy{h.MemberId, h.RaftTerm}
	}
	readKV := func(kvs []*mvccKV) {
		if len(kvs) > 0 {
			out.Exists, out.Value, out.Mod = true, string(kvs[0].Value), kvs[0].ModRevision
		}
	}
	switch in.Op {
	case opGet:
		r, err := cli.Get(ctx, key)
		if err != nil {
			return out, from, err
		}
		out.Rev = r.Header.Revision
		by(r.Header)
		readKV(r.Kvs)
	case opPut:
		r, err := cli.Put(ctx, key, in.Value)
		if err != nil {
			return out, from, err
		}
		out.Rev = r.Header.Revision
		by(r.Header)
	case opDelete:
		r, err := cli.Delete(ctx, key)
		if err != nil {
			return out, from, err
		}
		out.Rev, out.Deleted = r.Header.Revision, r.Deleted
		by(r.Header)
	case opCAS:
		cmp := clientv3.Compare(clientv3.ModRevision(key), "=", in.ExpectMod)
		if in.OnValue {
			cmp = clientv3.Compare(clientv3.Value(key), "=", in.ExpectValue)
		}
		r, err := cli.Txn(ctx).If(cmp).Then(clientv3.OpPut(key, in.Value)).Else(clientv3.OpGet(key)).Commit()
		if err != nil {
			return out, from, err
		}
		out.Rev, out.Succeeded = r.Header.Revision, r.Succeeded
		by(r.Header)
		if !r.Succeeded && len(r.Responses) == 1 {
			readKV(r.Responses[0].GetResponseRange().Kvs)
		}
	}
	return out, from, nil
}
