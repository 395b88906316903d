// brainload is the benchmark harness's load generator for servers that speak
// the etcd v3 API (brain, etcd, kine). One subcommand per workload; each run
// is bounded by --duration or a count, prints progress and errors on stderr
// and exactly one JSON object as the last line of stdout.
//
// See benchmarks/BUILD.md for the full flag and field reference.
package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"brain.tests/clientsetup"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
)

var processStart = time.Now()

type workload struct {
	run   func(args []string) (result, error)
	brief string
}

var workloads = map[string]workload{
	"put":           {runPut, "Put random keys of a keyspace"},
	"range":         {runRange, "single-key Get of existing keys"},
	"txn-put":       {runTxnPut, "kube-apiserver update: Txn(ModRevision == last, Put, else Get)"},
	"load":          {runLoad, "write exactly --count keys as fast as possible"},
	"list":          {runList, "paginated list of the whole prefix at one revision"},
	"count":         {runCount, "Get(prefix, count only) repeatedly"},
	"watch":         {runWatch, "W watchers on the prefix, measure event delivery"},
	"lease":         {runLease, "Grant + Put WithLease, then time the expiry"},
	"k8s-mix":       {runK8sMix, "node lease renewals plus pod status updates on a schedule"},
	"node-capacity": {runNodeCapacity, "one step of the node-capacity ramp: a cluster of --nodes nodes' writes, open loop, judged by the SLO"},
	"keepalive":     {runKeepAlive, "keep --leases leases alive through one LeaseKeepAlive stream"},
	"restart-probe": {runRestartProbe, "time until a linearizable Get succeeds"},
	"scale-load":    {runScaleLoad, "write the scale group's Kubernetes-shaped keys (Txn batches), then overwrites"},
	"scale-read":    {runScaleRead, "one whole read, timed: paged list, RangeStream, keys_only or a watch from a revision"},
}

// result is the JSON object printed at the end; "workload" is always set.
type result map[string]any

func main() {
	if len(os.Args) < 2 || os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help" {
		usage()
		if len(os.Args) < 2 {
			os.Exit(2)
		}
		return
	}
	name := os.Args[1]
	w, ok := workloads[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "brainload: unknown workload %q\n", name)
		usage()
		os.Exit(2)
	}
	res, err := w.run(os.Args[2:])
	if res == nil {
		res = result{}
	}
	res["workload"] = name
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintf(os.Stderr, "brainload %s: %v\n", name, err)
		res["failure"] = err.Error()
	}
	out, jerr := json.Marshal(res)
	if jerr != nil {
		fmt.Fprintf(os.Stderr, "brainload: encoding the result: %v\n", jerr)
		os.Exit(1)
	}
	fmt.Println(string(out))
	if err != nil {
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: brainload WORKLOAD [flags]   (brainload WORKLOAD -h for its flags)")
	names := make([]string, 0, len(workloads))
	for n := range workloads {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(os.Stderr, "  %-14s %s\n", n, workloads[n].brief)
	}
}

// common holds the flags every workload takes.
type common struct {
	endpoints string
	clients   int
	conns     int
	duration  time.Duration
	prefix    string
	valSize   int
	opTimeout time.Duration
	verbose   bool
	caFile    string
	certFile  string
	keyFile   string
	tls       *tls.Config

	fs *flag.FlagSet
}

func newFlags(name string, defClients int, defDuration time.Duration) *common {
	c := &common{fs: flag.NewFlagSet(name, flag.ContinueOnError)}
	c.fs.StringVar(&c.endpoints, "endpoints", "127.0.0.1:2379", "comma-separated server endpoints (host:port or http://host:port)")
	c.fs.IntVar(&c.clients, "clients", defClients, "concurrent client goroutines")
	c.fs.IntVar(&c.conns, "conns", 0, "gRPC connections, clients spread round-robin over them (0 = min(clients, 16))")
	c.fs.DurationVar(&c.duration, "duration", defDuration, "how long the timed phase runs")
	c.fs.StringVar(&c.prefix, "prefix", "/bench/", "key prefix")
	c.fs.IntVar(&c.valSize, "val-size", 256, "value size in bytes")
	c.fs.DurationVar(&c.opTimeout, "op-timeout", 30*time.Second, "timeout of one request")
	c.fs.BoolVar(&c.verbose, "verbose", false, "log the etcd client's warnings to stderr")
	c.fs.StringVar(&c.caFile, "cacert", "", "TLS: verify the server with this CA bundle (https:// endpoints)")
	c.fs.StringVar(&c.certFile, "cert", "", "TLS: client certificate (mutual TLS)")
	c.fs.StringVar(&c.keyFile, "key", "", "TLS: client key (mutual TLS)")
	return c
}

func (c *common) parse(args []string) error {
	if err := c.fs.Parse(args); err != nil {
		return err
	}
	if c.fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", c.fs.Args())
	}
	if c.clients < 1 {
		return fmt.Errorf("--clients must be >= 1")
	}
	if c.conns <= 0 {
		c.conns = min(c.clients, 16)
	}
	if c.valSize < 0 {
		return fmt.Errorf("--val-size must be >= 0")
	}
	if c.caFile != "" || c.certFile != "" || c.keyFile != "" {
		info := transport.TLSInfo{CertFile: c.certFile, KeyFile: c.keyFile, TrustedCAFile: c.caFile}
		cfg, err := info.ClientConfig()
		if err != nil {
			return fmt.Errorf("TLS: %w", err)
		}
		c.tls = cfg
	}
	return nil
}

func (c *common) endpointList() []string { return clientsetup.Endpoints(c.endpoints) }

// config is the client configuration every connection uses.
func (c *common) config() clientv3.Config {
	return clientv3.Config{
		Endpoints:          c.endpointList(),
		DialTimeout:        5 * time.Second,
		MaxCallSendMsgSize: 64 << 20,
		MaxCallRecvMsgSize: 64 << 20,
		Logger:             clientsetup.Logger(c.verbose),
		TLS:                c.tls,
	}
}

// pool is n clients, each with its own gRPC connection.
type pool []*clientv3.Client

func (c *common) dial(n int) (pool, error) { return c.dialTo(c.endpoints, n) }

// dialTo is dial to another comma list of endpoints than --endpoints (a
// workload that sends some keys elsewhere).
func (c *common) dialTo(endpoints string, n int) (pool, error) {
	p := make(pool, 0, n)
	for i := 0; i < n; i++ {
		cfg := c.config()
		cfg.Endpoints = clientsetup.Endpoints(endpoints)
		cli, err := clientv3.New(cfg)
		if err != nil {
			p.close()
			return nil, fmt.Errorf("connecting to %s: %w", endpoints, err)
		}
		p = append(p, cli)
		// clientv3.New does not wait for the connection: one Get of a key
		// that need not exist, within the 5 s dial timeout, makes an
		// unreachable server fail here instead of on every op.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err = cli.Get(ctx, c.prefix+"brainload-connect-check")
		cancel()
		if err != nil {
			p.close()
			return nil, fmt.Errorf("connecting to %s: %w", endpoints, err)
		}
	}
	return p, nil
}

func (p pool) get(i int) *clientv3.Client { return p[i%len(p)] }

func (p pool) close() {
	for _, c := range p {
		c.Close()
	}
}

func (c *common) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), c.opTimeout)
}

// errLog counts errors and prints the first few to stderr.
type errLog struct {
	mu    sync.Mutex
	n     int64
	first string
	kinds map[string]int
}

func (e *errLog) add(where string, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.n++
	msg := where + ": " + err.Error()
	if e.first == "" {
		e.first = msg
	}
	if e.kinds == nil {
		e.kinds = map[string]int{}
	}
	e.kinds[msg]++
	if e.kinds[msg] <= 3 && len(e.kinds) <= 20 {
		fmt.Fprintf(os.Stderr, "error: %s\n", msg)
	}
}

func (e *errLog) count() int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.n
}

func (e *errLog) into(r result) {
	e.mu.Lock()
	defer e.mu.Unlock()
	r["errors"] = e.n
	if e.first != "" {
		r["first_error"] = e.first
	}
}

// keyName is the i-th key under prefix, zero-padded so keys sort by index.
func keyName(prefix string, i int) string { return fmt.Sprintf("%s%010d", prefix, i) }

const letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"

func randValue(n int) string {
	b := make([]byte, n)
	for i := range b {
		b[i] = letters[rand.IntN(len(letters))]
	}
	return string(b)
}

// timedLoop runs op on `clients` goroutines until d has passed (no new op
// starts after it) and returns the merged latency histogram, the number of
// successful ops and the elapsed seconds. op returns an error for a failed op.
func timedLoop(clients int, d time.Duration, el *errLog, where string, op func(w int) error) (*hist, int64, float64) {
	start := time.Now()
	deadline := start.Add(d)
	hs := make([]*hist, clients)
	var ok atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < clients; w++ {
		hs[w] = newHist()
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			h := hs[w]
			for time.Now().Before(deadline) {
				t0 := time.Now()
				if err := op(w); err != nil {
					el.add(where, err)
					time.Sleep(10 * time.Millisecond) // no busy loop on a failing server
					continue
				}
				h.add(time.Since(t0))
				ok.Add(1)
			}
		}(w)
	}
	stop := progress(where, func() int64 { return ok.Load() })
	wg.Wait()
	stop()
	return mergeHists(hs), ok.Load(), time.Since(start).Seconds()
}

// countLoop runs op for i in [0, n) on `clients` goroutines.
func countLoop(clients, n int, el *errLog, where string, op func(w, i int) error) (*hist, int64, float64) {
	start := time.Now()
	hs := make([]*hist, clients)
	var next, ok atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < clients; w++ {
		hs[w] = newHist()
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			h := hs[w]
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				t0 := time.Now()
				if err := op(w, i); err != nil {
					el.add(where, err)
					time.Sleep(10 * time.Millisecond) // no busy loop on a failing server
					continue
				}
				h.add(time.Since(t0))
				ok.Add(1)
			}
		}(w)
	}
	stop := progress(where, func() int64 { return ok.Load() })
	wg.Wait()
	stop()
	return mergeHists(hs), ok.Load(), time.Since(start).Seconds()
}

// progress prints the op count every 5 s to stderr until stopped.
func progress(where string, n func() int64) func() {
	done := make(chan struct{})
	start := time.Now()
	go func() {
		t := time.NewTicker(5 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				fmt.Fprintf(os.Stderr, "%s: %d ops after %.0f s\n", where, n(), time.Since(start).Seconds())
			}
		}
	}()
	return func() { close(done) }
}

// fill sets the common result fields.
func fill(r result, clients int, h *hist, ops int64, secs float64, el *errLog) result {
	r["clients"] = clients
	r["ops"] = ops
	r["seconds"] = round3(secs)
	if secs > 0 {
		r["ops_per_s"] = round3(float64(ops) / secs)
	} else {
		r["ops_per_s"] = 0.0
	}
	r["latency_ms"] = h.summary()
	el.into(r)
	return r
}

// preload puts keys[i] (value from val) for all i with `clients` goroutines
// and returns each key's mod revision (0 where the put failed).
func preload(p pool, c *common, clients int, keys []string, val func(i int) string, el *errLog) ([]int64, error) {
	revs := make([]int64, len(keys))
	fmt.Fprintf(os.Stderr, "preloading %d keys\n", len(keys))
	_, ok, secs := countLoop(clients, len(keys), el, "preload", func(w, i int) error {
		ctx, cancel := c.ctx()
		defer cancel()
		resp, err := p.get(w).Put(ctx, keys[i], val(i))
		if err != nil {
			return err
		}
		revs[i] = resp.Header.Revision
		return nil
	})
	fmt.Fprintf(os.Stderr, "preloaded %d keys in %.1f s\n", ok, secs)
	if int(ok) != len(keys) {
		return revs, fmt.Errorf("preload: %d of %d puts failed", len(keys)-int(ok), len(keys))
	}
	return revs, nil
}

// probeDialOptions make reconnects quick, for restart-probe.
func probeDialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
		Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 200 * time.Millisecond},
		MinConnectTimeout: 200 * time.Millisecond,
	})}
}

// flagSet reports whether the flag was given on the command line.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) {
		if f.Name == name {
			set = true
		}
	})
	return set
}
