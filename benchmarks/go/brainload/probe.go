package main

import (
	"context"
	"fmt"
	"os"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// restart-probe: a linearizable Get of --key, one try every --interval with
// a --try-timeout deadline, until one succeeds or --timeout passes since
// brainload started. ready_after_s is measured from brainload's own start:
// start it when the server starts.
func runRestartProbe(args []string) (result, error) {
	c := newFlags("restart-probe", 1, 0)
	key := c.fs.String("key", "", "key to read (default <prefix>probe; it need not exist)")
	tryTimeout := c.fs.Duration("try-timeout", 200*time.Millisecond, "deadline of one try")
	interval := c.fs.Duration("interval", 50*time.Millisecond, "pause between failed tries")
	timeout := c.fs.Duration("timeout", 120*time.Second, "give up after this long")
	if err := c.parse(args); err != nil {
		return nil, err
	}
	if *key == "" {
		*key = c.prefix + "probe"
	}
	// No DialTimeout: New returns at once and the connection is retried in
	// the background with a short backoff instead of gRPC's 1 s..120 s.
	cfg := c.config()
	cfg.DialTimeout = 0
	cfg.DialOptions = probeDialOptions()
	cli, err := clientv3.New(cfg)
	if err != nil {
		return result{"ready_after_s": nil}, err
	}
	defer cli.Close()
	el := &errLog{}
	attempts := 0
	deadline := processStart.Add(*timeout)
	for {
		attempts++
		ctx, cancel := context.WithTimeout(context.Background(), *tryTimeout)
		t0 := time.Now()
		_, err := cli.Get(ctx, *key)
		cancel()
		if err == nil {
			ready := time.Since(processStart).Seconds()
			fmt.Fprintf(os.Stderr, "restart-probe: ready after %.3f s (%d tries)\n", ready, attempts)
			r := result{"ready_after_s": round3(ready), "ops": attempts, "last_try_ms": round3(float64(time.Since(t0)) / 1e6)}
			r["errors"] = el.count()
			return r, nil
		}
		if el.count() < 3 || c.verbose {
			el.add("get", err)
		} else {
			el.n++ // count quietly
		}
		if time.Now().After(deadline) {
			r := result{"ready_after_s": nil, "ops": attempts}
			el.into(r)
			return r, fmt.Errorf("not ready after %v", *timeout)
		}
		if d := time.Until(t0.Add(*interval)); d > 0 {
			time.Sleep(d)
		}
	}
}
