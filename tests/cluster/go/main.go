// clustercheck checks what a replicated etcd v3 server promises while its
// members are killed: linearizability (porcupine), mutual exclusion through
// concurrency.Mutex, acknowledged writes that survive, write pauses, and
// watch continuity. It is a client only: the caller (tests/support/clustercheck.py)
// starts the servers and injects the faults.
//
// One subcommand per check; each run is bounded by --duration (and the check
// by --check-timeout), prints progress and errors on stderr and exactly one
// JSON object as the last line of stdout. The exit code is 0 when the run
// completed and found nothing wrong, 1 when it found a violation (the JSON
// says which), 2 on bad usage or when the run itself could not be done.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"brain.tests/clientsetup"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// processStart is time zero of every relative time in a result ("t" fields,
// in seconds); the result also carries it as start_unix.
var processStart = time.Now()

type mode struct {
	run   func(args []string) (result, error)
	brief string
}

var modes = map[string]mode{
	"lin":    {runLin, "put/get/CAS/delete on a few keys, history checked by porcupine"},
	"mutex":  {runMutex, "concurrency.Mutex around a read-modify-write counter"},
	"write":  {runWrite, "unique-key writer: acknowledged revisions and write pauses"},
	"verify": {runVerify, "every write of a --record file present at its revision"},
	"watch":  {runWatch, "watch from a revision: every revision once, in order, none missing"},
}

// result is the JSON object printed at the end; "mode" and "violations" are
// always set.
type result map[string]any

// errUsage marks errors in the command line (exit code 2, like flag errors).
var errUsage = errors.New("usage")

func main() {
	if len(os.Args) < 2 || os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help" {
		usage()
		if len(os.Args) < 2 {
			os.Exit(2)
		}
		return
	}
	name := os.Args[1]
	m, ok := modes[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "clustercheck: unknown mode %q\n", name)
		usage()
		os.Exit(2)
	}
	res, err := m.run(os.Args[2:])
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if res == nil {
		res = result{}
	}
	res["mode"] = name
	res["start_unix"] = float64(processStart.UnixNano()) / 1e9
	if _, ok := res["violations"]; !ok {
		res["violations"] = 0
	}
	code := 0
	if err != nil {
		fmt.Fprintf(os.Stderr, "clustercheck %s: %v\n", name, err)
		res["failure"] = err.Error()
		code = 2
	} else if v, _ := res["violations"].(int); v > 0 {
		code = 1
	}
	out, jerr := json.Marshal(res)
	if jerr != nil {
		fmt.Fprintf(os.Stderr, "clustercheck: encoding the result: %v\n", jerr)
		os.Exit(2)
	}
	fmt.Println(string(out))
	os.Exit(code)
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: clustercheck MODE [flags]   (clustercheck MODE -h for its flags)")
	names := make([]string, 0, len(modes))
	for n := range modes {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(os.Stderr, "  %-7s %s\n", n, modes[n].brief)
	}
}

// common holds the flags every mode takes.
type common struct {
	endpoints   string
	duration    time.Duration
	prefix      string
	opTimeout   time.Duration
	dialTimeout time.Duration
	spread      bool
	verbose     bool
	stopFile    string

	fs      *flag.FlagSet
	stopped atomic.Bool
}

// newFlags: the default --prefix is /clustercheck/<name>/, so that modes run
// against one cluster do not see each other's keys (watch shares write's).
func newFlags(name string, defDuration time.Duration) *common {
	c := &common{fs: flag.NewFlagSet(name, flag.ContinueOnError)}
	c.fs.StringVar(&c.endpoints, "endpoints", "127.0.0.1:2379", "comma-separated endpoints (host:port or http://host:port); the client balances over all of them")
	c.fs.DurationVar(&c.duration, "duration", defDuration, "how long operations are issued")
	defPrefix := "/clustercheck/" + name + "/"
	if name == "watch" {
		defPrefix = "/clustercheck/write/"
	}
	c.fs.StringVar(&c.prefix, "prefix", defPrefix, "key prefix")
	c.fs.DurationVar(&c.opTimeout, "op-timeout", 2*time.Second, "timeout of one request; a write that times out has an unknown outcome")
	c.fs.DurationVar(&c.dialTimeout, "dial-timeout", 5*time.Second, "how long to wait for the first connection")
	c.fs.BoolVar(&c.spread, "spread", false, "give client i the single endpoint i mod len(endpoints) instead of all of them")
	c.fs.BoolVar(&c.verbose, "verbose", false, "log the etcd client's warnings to stderr")
	c.fs.StringVar(&c.stopFile, "stop-file", "", "stop issuing operations once this file exists, before --duration is up (the caller's faults are done)")
	return c
}

// issuing says whether operations may still be issued: before the deadline
// and before --stop-file appeared (watchStopFile polls it).
func (c *common) issuing(deadline time.Time) bool {
	return time.Now().Before(deadline) && !c.stopped.Load()
}

// watchStopFile polls --stop-file until it exists or the deadline passes.
func (c *common) watchStopFile(deadline time.Time) {
	if c.stopFile == "" {
		return
	}
	go func() {
		for time.Now().Before(deadline) {
			if _, err := os.Stat(c.stopFile); err == nil {
				c.stopped.Store(true)
				fmt.Fprintf(os.Stderr, "%8.3f %s exists: stopping\n", since(time.Now()), c.stopFile)
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
}

func (c *common) parse(args []string) error {
	if err := c.fs.Parse(args); err != nil {
		return err
	}
	if c.fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected arguments %q", errUsage, c.fs.Args())
	}
	if len(c.endpointList()) == 0 {
		return fmt.Errorf("%w: --endpoints is empty", errUsage)
	}
	if c.duration <= 0 {
		return fmt.Errorf("%w: --duration must be > 0", errUsage)
	}
	return nil
}

func (c *common) endpointList() []string { return clientsetup.Endpoints(c.endpoints) }

// dialClient is client i's connection: over every endpoint, or with
// --spread over endpoint i mod len(endpoints) alone.
func (c *common) dialClient(i int) (*clientv3.Client, error) {
	eps := c.endpointList()
	if c.spread {
		eps = eps[i%len(eps) : i%len(eps)+1]
	}
	return c.dialTo(eps)
}

// dialClients connects n clients (dialClient 0..n-1).
func (c *common) dialClients(n int) ([]*clientv3.Client, error) {
	conns := make([]*clientv3.Client, 0, n)
	for i := 0; i < n; i++ {
		cli, err := c.dialClient(i)
		if err != nil {
			closeAll(conns)
			return nil, err
		}
		conns = append(conns, cli)
	}
	return conns, nil
}

func closeAll(conns []*clientv3.Client) {
	for _, cli := range conns {
		cli.Close()
	}
}

// clearPrefix deletes every key under --prefix; it returns the revision
// after the delete.
func (c *common) clearPrefix(cli *clientv3.Client) (int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := cli.Delete(ctx, c.prefix, clientv3.WithPrefix())
	if err != nil {
		return 0, fmt.Errorf("clearing %s: %w", c.prefix, err)
	}
	return r.Header.Revision, nil
}

// dial connects one client to every endpoint (--spread or not).
func (c *common) dial() (*clientv3.Client, error) { return c.dialTo(c.endpointList()) }

// dialTo connects one client to endpoints and waits until a Get succeeds,
// so an unreachable cluster fails the run at once instead of making every
// operation's outcome unknown. Keepalive pings notice a killed member within
// about a second, so the balancer moves on instead of waiting for TCP.
func (c *common) dialTo(endpoints []string) (*clientv3.Client, error) {
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:            endpoints,
		DialTimeout:          c.dialTimeout,
		DialKeepAliveTime:    time.Second,
		DialKeepAliveTimeout: time.Second,
		Logger:               clientsetup.Logger(c.verbose),
	})
	if err != nil {
		return nil, fmt.Errorf("connecting to %s: %w", strings.Join(endpoints, ","), err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.dialTimeout)
	defer cancel()
	for {
		_, err = cli.Get(ctx, c.prefix+"connect-check")
		if err == nil {
			return cli, nil
		}
		if ctx.Err() != nil {
			cli.Close()
			return nil, fmt.Errorf("connecting to %s: %w", strings.Join(endpoints, ","), err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (c *common) ctx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), c.opTimeout)
}

// since is the time from processStart in seconds.
func since(t time.Time) float64 { return t.Sub(processStart).Seconds() }

// errLog counts errors by text and prints the first few of each to stderr.
type errLog struct {
	mu    sync.Mutex
	n     int64
	kinds map[string]int
}

func (e *errLog) add(where string, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.n++
	msg := where + ": " + err.Error()
	if e.kinds == nil {
		e.kinds = map[string]int{}
	}
	e.kinds[msg]++
	if e.kinds[msg] <= 2 && len(e.kinds) <= 20 {
		fmt.Fprintf(os.Stderr, "%8.3f error: %s\n", since(time.Now()), msg)
	}
}

// into records the error count and the most frequent texts.
func (e *errLog) into(r result) {
	e.mu.Lock()
	defer e.mu.Unlock()
	r["errors"] = e.n
	type kv struct {
		k string
		n int
	}
	var all []kv
	for k, n := range e.kinds {
		all = append(all, kv{k, n})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].n > all[j].n || all[i].n == all[j].n && all[i].k < all[j].k })
	top := map[string]int{}
	for i := 0; i < len(all) && i < 10; i++ {
		top[all[i].k] = all[i].n
	}
	r["error_kinds"] = top
}

// writeFileAtomic writes data to path through a temporary file and a rename,
// so a reader polling for path never sees half of it.
func writeFileAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
