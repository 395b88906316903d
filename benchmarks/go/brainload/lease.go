package main

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// lease: Grant --leases leases of --ttl seconds with one key each (Put
// WithLease), then poll a count-only Get every 100 ms until no key is left.
func runLease(args []string) (result, error) {
	c := newFlags("lease", 16, 0)
	leases := c.fs.Int("leases", 10000, "leases to grant, one key each")
	ttl := c.fs.Int64("ttl", 5, "lease TTL in seconds")
	timeout := c.fs.Duration("timeout", 120*time.Second, "give up waiting for expiry after this long past the last deadline")
	if err := c.parse(args); err != nil {
		return nil, err
	}
	if *leases < 1 || *ttl < 1 {
		return nil, fmt.Errorf("--leases and --ttl must be >= 1")
	}
	p, err := c.dial(c.conns)
	if err != nil {
		return nil, err
	}
	defer p.close()
	prefix := c.prefix + "lease/"
	val := randValue(c.valSize)
	el := &errLog{}
	var mu sync.Mutex
	var firstGrant, lastGrant time.Time
	h, ops, secs := countLoop(c.clients, *leases, el, "lease grant+put", func(w, i int) error {
		cli := p.get(w)
		ctx, cancel := c.ctx()
		defer cancel()
		g, err := cli.Grant(ctx, *ttl)
		if err != nil {
			return fmt.Errorf("grant: %w", err)
		}
		granted := time.Now()
		mu.Lock()
		if firstGrant.IsZero() || granted.Before(firstGrant) {
			firstGrant = granted
		}
		if granted.After(lastGrant) {
			lastGrant = granted
		}
		mu.Unlock()
		if _, err := cli.Put(ctx, keyName(prefix, i), val, clientv3.WithLease(g.ID)); err != nil {
			return fmt.Errorf("put with lease: %w", err)
		}
		return nil
	})
	r := fill(result{"leases": *leases, "ttl_s": *ttl, "val_size": c.valSize, "conns": c.conns}, c.clients, h, ops, secs, el)
	r["grant_put_per_s"] = r["ops_per_s"]
	if ops == 0 {
		return r, fmt.Errorf("no grant+put succeeded")
	}
	if secs > float64(*ttl) {
		fmt.Fprintf(os.Stderr, "lease: warning: granting took %.1f s, longer than the %d s TTL\n", secs, *ttl)
	}

	// Expiry: first possible expiry is firstGrant + ttl, all leases are due by
	// lastGrant + ttl.
	firstDue := firstGrant.Add(time.Duration(*ttl) * time.Second)
	lastDue := lastGrant.Add(time.Duration(*ttl) * time.Second)
	giveUp := lastDue.Add(*timeout)
	cli := p.get(0)
	left := int64(-1)
	var gone time.Time
	polls := 0
	lastReport := time.Now()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		cancel()
		polls++
		if err != nil {
			el.add("count", err)
		} else {
			left = resp.Count
			if left == 0 {
				gone = time.Now()
				break
			}
		}
		if time.Now().After(giveUp) {
			break
		}
		if time.Since(lastReport) > 5*time.Second {
			fmt.Fprintf(os.Stderr, "lease: %d keys left, %.1f s after the first deadline\n", left, time.Since(firstDue).Seconds())
			lastReport = time.Now()
		}
		time.Sleep(100 * time.Millisecond)
	}
	el.into(r)
	r["keys_left"] = left
	if gone.IsZero() {
		return r, fmt.Errorf("%d keys still there %v after the last lease's deadline", left, *timeout)
	}
	r["expire_seconds"] = round3(gone.Sub(firstDue).Seconds())
	r["expire_after_last_deadline_s"] = round3(gone.Sub(lastDue).Seconds())
	fmt.Fprintf(os.Stderr, "lease: all keys gone %.2f s after the first deadline (%.2f s after the last)\n",
		gone.Sub(firstDue).Seconds(), gone.Sub(lastDue).Seconds())
	return r, nil
}
