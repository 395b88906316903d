package main

// The scale group (benchmarks/groups.py, group "scale"): scale-load writes a
// Kubernetes-shaped data set, scale-read times one whole read of it.
//
// The data set is a function of (--keys, --seed) alone. Key i's kind, its
// namespace and its value size come from a hash of (seed, i); values are
// slices of one random block made from the seed. So every server gets the
// same keys and bytes, in whatever order the clients happen to write them.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// shape is one kind of object: its share of the keys (per mille), where its
// keys live and its value sizes. Sizes are minSize + (maxSize-minSize)*u^skew
// for u uniform in [0, 1): skew 1 is uniform, larger skews favour small ones.
type shape struct {
	kind    string // the resource, as in /registry/<kind>/
	share   int    // keys per 1000
	cluster bool   // not namespaced: /registry/<kind>/<name>
	fixedNS string // all in one namespace (node leases: kube-node-lease)
	minSize int
	maxSize int
	skew    float64
}

// The shares of issue 17: 40% node leases ~350 B, 25% events ~700 B, 20% pods
// of 1.5-4 KiB (most near the small end, as pods without big annotations
// are), 15% other kinds ~1 KiB.
var shapes = []shape{
	{kind: "leases", share: 400, fixedNS: "kube-node-lease", minSize: 300, maxSize: 400, skew: 1},
	{kind: "events", share: 250, minSize: 600, maxSize: 800, skew: 1},
	{kind: "pods", share: 200, minSize: 1536, maxSize: 4096, skew: 2},
	{kind: "configmaps", share: 40, minSize: 800, maxSize: 1250, skew: 1},
	{kind: "secrets", share: 30, minSize: 800, maxSize: 1250, skew: 1},
	{kind: "services", share: 30, minSize: 800, maxSize: 1250, skew: 1},
	{kind: "endpointslices", share: 30, minSize: 800, maxSize: 1250, skew: 1},
	{kind: "nodes", share: 20, cluster: true, minSize: 800, maxSize: 1250, skew: 1},
}

// The small mix, for data sets of ten million keys on one machine: mostly
// node leases and events, a few 3-4 KiB pods, about 540 B a value on average
// (the kubernetes mix above averages about 1 KiB).
var smallShapes = []shape{
	{kind: "leases", share: 450, fixedNS: "kube-node-lease", minSize: 300, maxSize: 400, skew: 1},
	{kind: "events", share: 360, minSize: 400, maxSize: 600, skew: 1},
	{kind: "pods", share: 40, minSize: 3072, maxSize: 4096, skew: 1},
	{kind: "configmaps", share: 40, minSize: 300, maxSize: 600, skew: 1},
	{kind: "secrets", share: 30, minSize: 300, maxSize: 600, skew: 1},
	{kind: "services", share: 30, minSize: 300, maxSize: 600, skew: 1},
	{kind: "endpointslices", share: 30, minSize: 300, maxSize: 600, skew: 1},
	{kind: "nodes", share: 20, cluster: true, minSize: 800, maxSize: 1250, skew: 1},
}

var mixes = map[string][]shape{"kubernetes": shapes, "small": smallShapes}

const (
	namespaces = 1000
	valueBlock = 1 << 16
	// overwriteStride walks the key space in an order unrelated to the index
	// (any odd prime above every key count visits each index once).
	overwriteStride = 2654435761
)

// dataset is the deterministic description of the keys.
type dataset struct {
	shapes   []shape
	registry string
	keys     int
	seed     uint64
	block    []byte
}

func newDataset(kinds []shape, registry string, keys int, seed uint64) *dataset {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	block := make([]byte, valueBlock)
	for i := range block {
		block[i] = letters[r.IntN(len(letters))]
	}
	return &dataset{shapes: kinds, registry: registry, keys: keys, seed: seed, block: block}
}

// mix is splitmix64's finaliser: a well-spread hash of x.
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

func (d *dataset) hash(i int, salt uint64) uint64 {
	return mix(d.seed ^ mix(uint64(i)^(salt<<48)))
}

func (d *dataset) shapeOf(i int) *shape {
	n := int(d.hash(i, 0) % 1000)
	for k := range d.shapes {
		if n < d.shapes[k].share {
			return &d.shapes[k]
		}
		n -= d.shapes[k].share
	}
	return &d.shapes[len(d.shapes)-1]
}

func (d *dataset) prefix(s *shape) string { return d.registry + s.kind + "/" }

func (d *dataset) key(i int) (string, *shape) {
	s := d.shapeOf(i)
	switch {
	case s.fixedNS != "":
		return fmt.Sprintf("%s%s/node-%09d", d.prefix(s), s.fixedNS, i), s
	case s.cluster:
		return fmt.Sprintf("%sobj-%09d", d.prefix(s), i), s
	default:
		return fmt.Sprintf("%sns-%04d/obj-%09d", d.prefix(s), d.hash(i, 1)%namespaces, i), s
	}
}

// value is key i's value at its version'th write (0 = the create).
func (d *dataset) value(i int, s *shape, version uint64) string {
	h := d.hash(i, 2+version)
	u := float64(h>>11) / float64(1<<53)
	size := s.minSize + int(float64(s.maxSize-s.minSize)*math.Pow(u, s.skew))
	off := int(mix(h) % uint64(valueBlock-size))
	return string(d.block[off : off+size])
}

// overwriteIndex is the key the j-th overwrite of a pass writes; distinct
// for distinct j < keys.
func (d *dataset) overwriteIndex(j int, pass uint64) int {
	return int((uint64(j)*overwriteStride + mix(d.seed^pass)) % uint64(d.keys))
}

// kindTally counts one kind's writes.
type kindTally struct {
	Prefix string `json:"prefix"`
	Keys   int64  `json:"keys"`
	Puts   int64  `json:"puts"`
	Bytes  int64  `json:"value_bytes"`
}

// scale-load: create --keys keys (unless --create=false), then --overwrites
// overwrites of existing keys, in Txns of --batch puts on --clients clients.
func runScaleLoad(args []string) (result, error) {
	c := newFlags("scale-load", 64, 0)
	keys := c.fs.Int("keys", 100000, "keys of the data set")
	seed := c.fs.Uint64("seed", 1, "the data set's seed")
	create := c.fs.Bool("create", true, "write the keys (false: only the overwrites, on a loaded server)")
	overwrites := c.fs.Int("overwrites", 0, "overwrites of existing keys after the create, at most --keys")
	pass := c.fs.Uint64("pass", 1, "which overwrite pass (another pass picks other keys and values)")
	batch := c.fs.Int("batch", 64, "puts per Txn (etcd's --max-txn-ops is 128)")
	registry := c.fs.String("registry", "/registry/", "root of the keys")
	mixName := c.fs.String("mix", "kubernetes", "value sizes: kubernetes (about 1 KiB on average) or small (about 540 B)")
	if err := c.parse(args); err != nil {
		return nil, err
	}
	if *keys < 1 || *batch < 1 || *overwrites < 0 || *overwrites > *keys {
		return nil, fmt.Errorf("need --keys >= 1, --batch >= 1 and 0 <= --overwrites <= --keys")
	}
	kinds, ok := mixes[*mixName]
	if !ok {
		return nil, fmt.Errorf("unknown --mix %q", *mixName)
	}
	d := newDataset(kinds, *registry, *keys, *seed)
	p, err := c.dial(c.conns)
	if err != nil {
		return nil, err
	}
	defer p.close()
	revBefore, err := headRevision(c, p.get(0))
	if err != nil {
		return nil, err
	}
	tally := map[string]*kindTally{}
	for k := range d.shapes {
		tally[d.shapes[k].kind] = &kindTally{Prefix: d.prefix(&d.shapes[k])}
	}
	var mu sync.Mutex
	el := &errLog{}
	start := time.Now()
	var puts int64
	var retries atomic.Int64
	phase := func(where string, n int, index func(j int) int, version uint64, creating bool) error {
		batches := (n + *batch - 1) / *batch
		_, ok, _ := countLoop(c.clients, batches, el, where, func(w, b int) error {
			lo, hi := b**batch, min(n, (b+1)**batch)
			ops := make([]clientv3.Op, 0, hi-lo)
			local := map[string]*kindTally{}
			for j := lo; j < hi; j++ {
				i := index(j)
				k, s := d.key(i)
				v := d.value(i, s, version)
				ops = append(ops, clientv3.OpPut(k, v))
				t := local[s.kind]
				if t == nil {
					t = &kindTally{}
					local[s.kind] = t
				}
				t.Puts++
				t.Bytes += int64(len(v))
				if creating {
					t.Keys++
				}
			}
			if err := commitRetrying(c, p.get(w), ops, el, where, &retries); err != nil {
				return err
			}
			mu.Lock()
			for kind, t := range local {
				g := tally[kind]
				g.Puts += t.Puts
				g.Bytes += t.Bytes
				g.Keys += t.Keys
			}
			puts += int64(len(ops))
			mu.Unlock()
			return nil
		})
		if int(ok) != batches {
			return fmt.Errorf("%s: %d of %d Txns failed", where, batches-int(ok), batches)
		}
		return nil
	}
	if *create {
		err = phase("scale-create", *keys, func(j int) int { return j }, 0, true)
	}
	if err == nil && *overwrites > 0 {
		err = phase("scale-overwrite", *overwrites, func(j int) int { return d.overwriteIndex(j, *pass) }, *pass, false)
	}
	secs := time.Since(start).Seconds()
	r := result{"keys": *keys, "seed": *seed, "batch": *batch, "clients": c.clients, "conns": c.conns,
		"ops": puts, "seconds": round3(secs), "rev_before": revBefore, "kinds": tally, "retries": retries.Load()}
	if secs > 0 {
		r["puts_per_s"] = round3(float64(puts) / secs)
	}
	var bytes int64
	for _, t := range tally {
		bytes += t.Bytes
	}
	r["value_bytes"] = bytes
	if puts > 0 {
		r["avg_value_bytes"] = round3(float64(bytes) / float64(puts))
	}
	el.into(r)
	if err != nil {
		return r, err
	}
	if r["rev_after"], err = headRevision(c, p.get(0)); err != nil {
		return r, err
	}
	return r, nil
}

// loadAttempts is how often one Txn of the load is tried: a bulk loader
// retries what a busy server refused or timed out ("too many requests",
// a deadline), as the puts are idempotent.
const loadAttempts = 4

func commitRetrying(c *common, cli *clientv3.Client, ops []clientv3.Op, el *errLog, where string, retries *atomic.Int64) error {
	var err error
	for attempt := 0; attempt < loadAttempts; attempt++ {
		if attempt > 0 {
			el.add(where+" (retried)", err)
			retries.Add(1)
			time.Sleep(time.Duration(100<<attempt) * time.Millisecond)
		}
		ctx, cancel := c.ctx()
		_, err = cli.Txn(ctx).Then(ops...).Commit()
		cancel()
		if err == nil {
			return nil
		}
	}
	return err
}

func headRevision(c *common, cli *clientv3.Client) (int64, error) {
	ctx, cancel := c.ctx()
	defer cancel()
	resp, err := cli.Get(ctx, "\x00", clientv3.WithCountOnly())
	if err != nil {
		return 0, fmt.Errorf("head revision: %w", err)
	}
	return resp.Header.Revision, nil
}

// unimplemented reports whether err is the server's Unimplemented answer
// (a server without the RPC).
func unimplemented(err error) bool {
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		return ee.Code() == codes.Unimplemented
	}
	return status.Code(err) == codes.Unimplemented
}

// scale-read: one whole read of --prefix, timed, with its count checked.
//
//	list       pages of --limit at the first page's revision; every page's
//	           count must be the true count of the rest of the range and
//	           more == (len(kvs) < count), which kube-apiserver relies on
//	stream     KV.RangeStream (etcd 3.7); Unimplemented gives
//	           "unsupported": true and no error
//	keys-only  one keys_only Range (kube-apiserver's size estimate)
//	watch      a watch from --from-rev until --expect events arrived
func runScaleRead(args []string) (result, error) {
	c := newFlags("scale-read", 1, 0)
	op := c.fs.String("op", "list", "list, stream, keys-only or watch")
	limit := c.fs.Int64("limit", 500, "list: page size")
	expect := c.fs.Int64("expect", -1, "keys (watch: events) the read must return (-1 = no check)")
	fromRev := c.fs.Int64("from-rev", 0, "watch: the revision to start from")
	cpuProfile := c.fs.String("cpu-profile", "", "write a Go CPU profile of the timed read to this file (runtime/pprof)")
	if err := c.parse(args); err != nil {
		return nil, err
	}
	cfg := c.config()
	cfg.MaxCallRecvMsgSize = math.MaxInt32 // keys_only of every key is one response
	cli, err := clientv3.New(cfg)
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	if _, err := headRevision(c, cli); err != nil { // connected before the clock starts
		return nil, err
	}
	r := result{"op": *op, "prefix": c.prefix}
	if *cpuProfile != "" {
		// The profile covers the timed read alone: where the client's CPU goes (decoding, transport, GC).
		stop, err := startCPUProfile(*cpuProfile)
		if err != nil {
			return nil, err
		}
		defer stop()
		r["cpu_profile"] = *cpuProfile
	}
	cpu0 := processCPU()
	start := time.Now()
	var n, nbytes int64
	switch *op {
	case "list":
		n, nbytes, err = pagedList(c, cli, *limit, *expect, r)
		r["limit"] = *limit
	case "stream":
		n, nbytes, err = streamList(c, cli, *expect, r)
	case "keys-only":
		n, nbytes, err = keysOnly(c, cli, *expect)
	case "watch":
		n, nbytes, err = watchFrom(c, cli, *fromRev, *expect)
	default:
		return nil, fmt.Errorf("unknown --op %q", *op)
	}
	secs := time.Since(start).Seconds()
	// The client's whole process's CPU (getrusage), decoding and the rest:
	// --cpu-profile says which is which.
	r["client_cpu_s"] = round3(processCPU() - cpu0)
	if err != nil && unimplemented(err) { // no timing: nothing was read
		r["unsupported"] = true
		r["detail"] = err.Error()
		return r, nil
	}
	r["keys"], r["bytes"], r["seconds"] = n, nbytes, round3(secs)
	r["ops"] = n
	if secs > 0 {
		r["keys_per_s"] = round3(float64(n) / secs)
	}
	if err == nil && *expect >= 0 && n != *expect {
		err = fmt.Errorf("%s returned %d, expected %d", *op, n, *expect)
	}
	return r, err
}

// startCPUProfile starts runtime/pprof's CPU profile into path; the function
// it returns stops it and closes the file.
func startCPUProfile(path string) (func(), error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}

// processCPU is this process's user and system CPU time so far, in seconds.
func processCPU() float64 {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return float64(ru.Utime.Sec+ru.Stime.Sec) + float64(ru.Utime.Usec+ru.Stime.Usec)/1e6
}

func kvBytes(kvs []*mvccpb.KeyValue) int64 {
	var b int64
	for _, kv := range kvs {
		b += int64(len(kv.Key) + len(kv.Value))
	}
	return b
}

func pagedList(c *common, cli *clientv3.Client, limit, expect int64, r result) (int64, int64, error) {
	end := clientv3.GetPrefixRangeEnd(c.prefix)
	key := c.prefix
	var rev, n, nbytes int64
	pages := 0
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(limit)}
		if rev > 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		ctx, cancel := c.ctx()
		resp, err := cli.Get(ctx, key, opts...)
		cancel()
		if err != nil {
			return n, nbytes, fmt.Errorf("page %d: %w", pages+1, err)
		}
		if rev == 0 {
			rev = resp.Header.Revision
			r["first_count"] = resp.Count
			if expect >= 0 && resp.Count != expect {
				return n, nbytes, fmt.Errorf("first page: count %d, expected %d", resp.Count, expect)
			}
		}
		pages++
		got := int64(len(resp.Kvs))
		if expect >= 0 && resp.Count != expect-n {
			return n, nbytes, fmt.Errorf("page %d: count %d, but %d keys remain", pages, resp.Count, expect-n)
		}
		if resp.More != (got < resp.Count) {
			return n, nbytes, fmt.Errorf("page %d: more=%v with %d kvs of count %d", pages, resp.More, got, resp.Count)
		}
		n += got
		nbytes += kvBytes(resp.Kvs)
		if !resp.More || got == 0 {
			break
		}
		key = string(resp.Kvs[got-1].Key) + "\x00"
	}
	r["pages"], r["revision"] = pages, rev
	return n, nbytes, nil
}

func streamList(c *common, cli *clientv3.Client, expect int64, r result) (int64, int64, error) {
	ctx, cancel := c.ctx()
	defer cancel()
	ch, err := cli.GetStream(ctx, c.prefix, clientv3.WithPrefix())
	if err != nil {
		return 0, 0, err
	}
	var n, nbytes int64
	chunks := 0
	var last *clientv3.RangeStreamResponse
	for resp := range ch {
		if err := resp.Err(); err != nil {
			return n, nbytes, err
		}
		chunks++
		n += int64(len(resp.Kvs))
		nbytes += kvBytes(resp.Kvs)
		last = &resp
	}
	r["chunks"] = chunks
	if last == nil {
		return 0, 0, fmt.Errorf("the stream ended without a chunk")
	}
	if last.Header != nil {
		r["revision"] = last.Header.Revision
	}
	r["count"], r["more"] = last.Count, last.More
	if expect >= 0 && last.Count != expect {
		return n, nbytes, fmt.Errorf("last chunk: count %d, expected %d", last.Count, expect)
	}
	return n, nbytes, nil
}

func keysOnly(c *common, cli *clientv3.Client, expect int64) (int64, int64, error) {
	ctx, cancel := c.ctx()
	defer cancel()
	resp, err := cli.Get(ctx, c.prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return 0, 0, err
	}
	if expect >= 0 && resp.Count != expect {
		return int64(len(resp.Kvs)), 0, fmt.Errorf("count %d, expected %d", resp.Count, expect)
	}
	return int64(len(resp.Kvs)), kvBytes(resp.Kvs), nil
}

func watchFrom(c *common, cli *clientv3.Client, fromRev, expect int64) (int64, int64, error) {
	if expect < 0 {
		return 0, 0, fmt.Errorf("watch needs --expect (the events to wait for)")
	}
	ctx, cancel := c.ctx()
	defer cancel()
	wch := cli.Watch(clientv3.WithRequireLeader(ctx), c.prefix, clientv3.WithPrefix(), clientv3.WithRev(fromRev))
	var n, nbytes int64
	for wr := range wch {
		if err := wr.Err(); err != nil {
			return n, nbytes, err
		}
		for _, ev := range wr.Events {
			nbytes += int64(len(ev.Kv.Key) + len(ev.Kv.Value))
		}
		if n += int64(len(wr.Events)); n >= expect {
			return n, nbytes, nil
		}
	}
	return n, nbytes, fmt.Errorf("watch ended after %d of %d events: %v", n, expect, context.Cause(ctx))
}
