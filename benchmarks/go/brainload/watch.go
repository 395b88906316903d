package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/metadata"
)

// watch: --watchers watch streams on the prefix, then --writers put --events
// keys whose values start with the put's wall-clock UnixNano (19 digits);
// every watcher must see every event. Delivery latency = receive time -
// embedded send time, for each (watcher, event).
//
// The etcd client multiplexes all watches whose contexts carry the same
// gRPC metadata onto one stream per connection; each watcher here gets its
// own metadata value so it has its own Watch stream, as separate watching
// processes would (--share-streams turns that off).
func runWatch(args []string) (result, error) {
	c := newFlags("watch", 1, 0)
	watchers := c.fs.Int("watchers", 1000, "watch streams on --prefix")
	writers := c.fs.Int("writers", 4, "goroutines that put the events")
	events := c.fs.Int("events", 1000, "keys put in total (one event each)")
	rate := c.fs.Float64("rate", 0, "puts per second over all writers (0 = as fast as possible)")
	timeout := c.fs.Duration("timeout", 60*time.Second, "wait this long for watch creation, and for deliveries after the last put")
	share := c.fs.Bool("share-streams", false, "let watchers on one connection share a gRPC stream (the client's default)")
	if err := c.parse(args); err != nil {
		return nil, err
	}
	if *watchers < 1 || *writers < 1 || *events < 1 {
		return nil, fmt.Errorf("--watchers, --writers and --events must be >= 1")
	}
	if !flagSet(c.fs, "conns") {
		c.conns = min(*watchers, 16)
	}
	if c.valSize < 19 {
		c.valSize = 19
	}
	p, err := c.dial(c.conns)
	if err != nil {
		return nil, err
	}
	defer p.close()

	el := &errLog{}
	r := result{"watchers": *watchers, "writers": *writers, "rate": *rate, "conns": c.conns, "val_size": c.valSize, "share_streams": *share}

	// Watchers.
	type watcher struct {
		got    atomic.Int64
		lastNs atomic.Int64
		h      *hist
	}
	ws := make([]*watcher, *watchers)
	base, cancelAll := context.WithCancel(context.Background())
	defer cancelAll()
	var created, done sync.WaitGroup
	var createFailed, createdN atomic.Int64
	for i := range ws {
		ws[i] = &watcher{h: newHist()}
		created.Add(1)
		done.Add(1)
		go func(i int, wt *watcher) {
			defer done.Done()
			ctx := base
			if !*share {
				ctx = metadata.AppendToOutgoingContext(base, "brainload-watcher", strconv.Itoa(i))
			}
			wch := p.get(i).Watch(ctx, c.prefix, clientv3.WithPrefix(), clientv3.WithCreatedNotify())
			first := true
			for resp := range wch {
				if first {
					first = false
					created.Done()
					createdN.Add(1)
					if !resp.Created {
						createFailed.Add(1)
					}
				}
				if err := resp.Err(); err != nil {
					el.add("watch", err)
					if resp.Canceled {
						return
					}
					continue
				}
				now := time.Now().UnixNano()
				for _, ev := range resp.Events {
					if ev.Type != clientv3.EventTypePut || len(ev.Kv.Value) < 19 {
						continue
					}
					sent, err := strconv.ParseInt(string(ev.Kv.Value[:19]), 10, 64)
					if err != nil {
						continue
					}
					wt.h.addUs(float64(now-sent) / 1e3)
					wt.got.Add(1)
				}
				if len(resp.Events) > 0 {
					wt.lastNs.Store(now)
				}
			}
			if first {
				created.Done()
				createFailed.Add(1)
			}
		}(i, ws[i])
	}
	createdCh := make(chan struct{})
	go func() { created.Wait(); close(createdCh) }()
	tc := time.Now()
	select {
	case <-createdCh:
	case <-time.After(*timeout):
		el.into(r)
		r["watches_created"] = createdN.Load()
		return r, fmt.Errorf("only %d of %d watches were created within %v", createdN.Load(), *watchers, *timeout)
	}
	fmt.Fprintf(os.Stderr, "watch: %d watchers created in %.2f s\n", *watchers, time.Since(tc).Seconds())
	r["create_seconds"] = round3(time.Since(tc).Seconds())
	if n := createFailed.Load(); n > 0 {
		el.into(r)
		return r, fmt.Errorf("%d watches failed to start", n)
	}

	// Writers.
	pad := ""
	if c.valSize > 19 {
		pad = randValue(c.valSize - 19)
	}
	var next, written atomic.Int64
	putHists := make([]*hist, *writers)
	var wwg sync.WaitGroup
	t0 := time.Now()
	for w := 0; w < *writers; w++ {
		putHists[w] = newHist()
		wwg.Add(1)
		go func(w int) {
			defer wwg.Done()
			cli := p.get(w)
			for {
				i := next.Add(1) - 1
				if i >= int64(*events) {
					return
				}
				if *rate > 0 {
					at := t0.Add(time.Duration(float64(i) * 1e9 / *rate))
					if d := time.Until(at); d > 0 {
						time.Sleep(d)
					}
				}
				ctx, cancel := c.ctx()
				start := time.Now()
				val := fmt.Sprintf("%019d", start.UnixNano()) + pad
				_, err := cli.Put(ctx, keyName(c.prefix+"w", int(i)), val)
				cancel()
				if err != nil {
					el.add("put", err)
					continue
				}
				putHists[w].add(time.Since(start))
				written.Add(1)
			}
		}(w)
	}
	stop := progress("watch puts", func() int64 { return written.Load() })
	wwg.Wait()
	stop()
	writeSecs := time.Since(t0).Seconds()
	nw := written.Load()
	fmt.Fprintf(os.Stderr, "watch: %d events written in %.2f s, waiting for delivery\n", nw, writeSecs)

	// Wait for every watcher to get every written event.
	want := nw * int64(*watchers)
	complete := func() bool {
		for _, wt := range ws {
			if wt.got.Load() < nw {
				return false
			}
		}
		return true
	}
	waitUntil := time.Now().Add(*timeout)
	for !complete() && time.Now().Before(waitUntil) {
		time.Sleep(10 * time.Millisecond)
	}
	cancelAll()
	done.Wait()
	var lastNs, got, missing, dups int64
	hs := make([]*hist, len(ws))
	for i, wt := range ws {
		hs[i] = wt.h
		lastNs = max(lastNs, wt.lastNs.Load())
		g := wt.got.Load()
		got += g
		missing += max(nw-g, 0)
		dups += max(g-nw, 0)
	}
	h := mergeHists(hs)
	secs := 0.0
	if lastNs > 0 {
		secs = float64(lastNs-t0.UnixNano()) / 1e9
	}
	fill(r, *writers, h, got, secs, el)
	r["errors"] = el.count() + missing
	r["events_written"] = nw
	r["events_delivered"] = got
	r["missing"] = missing
	r["duplicates"] = dups
	r["delivered_per_s"] = r["ops_per_s"]
	r["write_seconds"] = round3(writeSecs)
	r["writes_per_s"] = round3(float64(nw) / writeSecs)
	r["put_latency_ms"] = mergeHists(putHists).summary()
	if nw == 0 {
		return r, fmt.Errorf("no put succeeded")
	}
	if missing > 0 {
		return r, fmt.Errorf("%d of %d deliveries missing after %v", missing, want, *timeout)
	}
	return r, nil
}
