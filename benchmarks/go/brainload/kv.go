package main

import (
	"fmt"
	"math/rand/v2"
	"os"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// put: Put random keys of a --keys keyspace.
func runPut(args []string) (result, error) {
	c := newFlags("put", 16, 10*time.Second)
	nkeys := c.fs.Int("keys", 100000, "keyspace size")
	if err := c.parse(args); err != nil {
		return nil, err
	}
	if *nkeys < 1 {
		return nil, fmt.Errorf("--keys must be >= 1")
	}
	p, err := c.dial(c.conns)
	if err != nil {
		return nil, err
	}
	defer p.close()
	vals := make([]string, c.clients)
	for i := range vals {
		vals[i] = randValue(c.valSize)
	}
	el := &errLog{}
	h, ops, secs := timedLoop(c.clients, c.duration, el, "put", func(w int) error {
		ctx, cancel := c.ctx()
		defer cancel()
		_, err := p.get(w).Put(ctx, keyName(c.prefix, rand.IntN(*nkeys)), vals[w])
		return err
	})
	r := fill(result{"keys": *nkeys, "val_size": c.valSize, "conns": c.conns}, c.clients, h, ops, secs, el)
	if ops == 0 {
		return r, fmt.Errorf("no put succeeded")
	}
	return r, nil
}

// range: single-key Get of preloaded keys.
func runRange(args []string) (result, error) {
	c := newFlags("range", 16, 10*time.Second)
	nkeys := c.fs.Int("keys", 1000, "keys to preload and read")
	serializable := c.fs.Bool("serializable", false, "serializable reads (default linearizable)")
	noLoad := c.fs.Bool("no-load", false, "do not preload the keys (they exist already)")
	if err := c.parse(args); err != nil {
		return nil, err
	}
	if *nkeys < 1 {
		return nil, fmt.Errorf("--keys must be >= 1")
	}
	p, err := c.dial(c.conns)
	if err != nil {
		return nil, err
	}
	defer p.close()
	r := result{"keys": *nkeys, "serializable": *serializable, "val_size": c.valSize, "conns": c.conns}
	el := &errLog{}
	if !*noLoad {
		keys := make([]string, *nkeys)
		for i := range keys {
			keys[i] = keyName(c.prefix, i)
		}
		val := randValue(c.valSize)
		if _, err := preload(p, c, c.clients, keys, func(int) string { return val }, el); err != nil {
			el.into(r)
			return r, err
		}
	}
	var opts []clientv3.OpOption
	if *serializable {
		opts = append(opts, clientv3.WithSerializable())
	}
	el = &errLog{}
	h, ops, secs := timedLoop(c.clients, c.duration, el, "range", func(w int) error {
		ctx, cancel := c.ctx()
		defer cancel()
		k := keyName(c.prefix, rand.IntN(*nkeys))
		resp, err := p.get(w).Get(ctx, k, opts...)
		if err != nil {
			return err
		}
		if len(resp.Kvs) != 1 {
			return fmt.Errorf("key %s: %d kvs returned", k, len(resp.Kvs))
		}
		return nil
	})
	fill(r, c.clients, h, ops, secs, el)
	if ops == 0 {
		return r, fmt.Errorf("no get succeeded")
	}
	return r, nil
}

// txn-put: the kube-apiserver's optimistic update. Client w owns the keys
// i with i % clients == w and remembers the mod revision it last saw.
func runTxnPut(args []string) (result, error) {
	c := newFlags("txn-put", 16, 10*time.Second)
	nkeys := c.fs.Int("keys", 10000, "keys in total (each client owns keys/clients of them)")
	if err := c.parse(args); err != nil {
		return nil, err
	}
	if *nkeys < c.clients {
		return nil, fmt.Errorf("--keys (%d) must be >= --clients (%d)", *nkeys, c.clients)
	}
	p, err := c.dial(c.conns)
	if err != nil {
		return nil, err
	}
	defer p.close()
	keys := make([]string, *nkeys)
	for i := range keys {
		keys[i] = keyName(c.prefix, i)
	}
	val := randValue(c.valSize)
	r := result{"keys": *nkeys, "val_size": c.valSize, "conns": c.conns}
	el := &errLog{}
	revs, err := preload(p, c, c.clients, keys, func(int) string { return val }, el)
	if err != nil {
		el.into(r)
		return r, err
	}
	el = &errLog{}
	succeeded := make([]int64, c.clients)
	failed := make([]int64, c.clients)
	next := make([]int, c.clients) // round robin over the client's own keys
	for w := range next {
		next[w] = w
	}
	h, ops, secs := timedLoop(c.clients, c.duration, el, "txn-put", func(w int) error {
		i := next[w]
		next[w] += c.clients
		if next[w] >= *nkeys {
			next[w] = w
		}
		ok, rev, err := txnPut(c, p.get(w), keys[i], revs[i], val)
		if err != nil {
			return err
		}
		revs[i] = rev
		if ok {
			succeeded[w]++
		} else {
			failed[w]++
		}
		return nil
	})
	fill(r, c.clients, h, ops, secs, el)
	r["succeeded"], r["failed"] = sum(succeeded), sum(failed)
	if ops == 0 {
		return r, fmt.Errorf("no txn succeeded")
	}
	return r, nil
}

// txnPut is Txn(If ModRevision(key) == lastRev, Then Put, Else Get); it
// returns whether the put happened and the key's current mod revision.
func txnPut(c *common, cli *clientv3.Client, key string, lastRev int64, val string) (bool, int64, error) {
	ctx, cancel := c.ctx()
	defer cancel()
	resp, err := cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(key), "=", lastRev)).
		Then(clientv3.OpPut(key, val)).
		Else(clientv3.OpGet(key)).
		Commit()
	if err != nil {
		return false, lastRev, err
	}
	if resp.Succeeded {
		return true, resp.Header.Revision, nil
	}
	if len(resp.Responses) == 1 {
		if rr := resp.Responses[0].GetResponseRange(); rr != nil && len(rr.Kvs) == 1 {
			return false, rr.Kvs[0].ModRevision, nil
		}
	}
	return false, lastRev, fmt.Errorf("txn on %s: else branch without the key", key)
}

func sum(xs []int64) int64 {
	var s int64
	for _, x := range xs {
		s += x
	}
	return s
}

// load: write exactly --count keys under --prefix, as fast as possible.
func runLoad(args []string) (result, error) {
	c := newFlags("load", 16, 0)
	count := c.fs.Int("count", 100000, "keys to write: prefix + 10-digit index, 0 <= index < count")
	start := c.fs.Int("start", 0, "first index")
	if err := c.parse(args); err != nil {
		return nil, err
	}
	p, err := c.dial(c.conns)
	if err != nil {
		return nil, err
	}
	defer p.close()
	vals := make([]string, c.clients)
	for i := range vals {
		vals[i] = randValue(c.valSize)
	}
	el := &errLog{}
	h, ops, secs := countLoop(c.clients, *count, el, "load", func(w, i int) error {
		ctx, cancel := c.ctx()
		defer cancel()
		_, err := p.get(w).Put(ctx, keyName(c.prefix, *start+i), vals[w])
		return err
	})
	r := fill(result{"count": *count, "val_size": c.valSize, "conns": c.conns}, c.clients, h, ops, secs, el)
	if ops != int64(*count) {
		return r, fmt.Errorf("%d of %d puts failed", int64(*count)-ops, *count)
	}
	return r, nil
}

// list: paginated listing of the whole prefix like the apiserver's: pages
// of --limit at the first page's revision, continuing at lastKey + "\x00".
func runList(args []string) (result, error) {
	c := newFlags("list", 1, 10*time.Second)
	limit := c.fs.Int64("limit", 500, "page size (0 = everything in one response)")
	expect := c.fs.Int("expect", -1, "fail unless every listing has this many keys (-1 = no check)")
	if err := c.parse(args); err != nil {
		return nil, err
	}
	p, err := c.dial(c.conns)
	if err != nil {
		return nil, err
	}
	defer p.close()
	end := clientv3.GetPrefixRangeEnd(c.prefix)
	el := &errLog{}
	lastKeys := make([]int, c.clients)
	lastPages := make([]int, c.clients)
	var mismatch atomic.Int64
	var bytes int64
	h, ops, secs := timedLoop(c.clients, c.duration, el, "list", func(w int) error {
		cli := p.get(w)
		key := c.prefix
		var rev int64
		keys, pages := 0, 0
		var nbytes int64
		for {
			ctx, cancel := c.ctx()
			opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(*limit)}
			if rev > 0 {
				opts = append(opts, clientv3.WithRev(rev))
			}
			resp, err := cli.Get(ctx, key, opts...)
			cancel()
			if err != nil {
				return fmt.Errorf("page %d: %w", pages+1, err)
			}
			if rev == 0 {
				rev = resp.Header.Revision
			}
			pages++
			keys += len(resp.Kvs)
			for _, kv := range resp.Kvs {
				nbytes += int64(len(kv.Key) + len(kv.Value))
			}
			if !resp.More || len(resp.Kvs) == 0 {
				break
			}
			key = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
		}
		lastKeys[w], lastPages[w] = keys, pages
		if w == 0 {
			bytes = nbytes
		}
		if *expect >= 0 && keys != *expect {
			mismatch.Add(1)
			return fmt.Errorf("listing returned %d keys, expected %d", keys, *expect)
		}
		return nil
	})
	r := fill(result{"limit": *limit, "keys": lastKeys[0], "pages": lastPages[0], "bytes": bytes, "conns": c.conns}, c.clients, h, ops, secs, el)
	if *expect >= 0 {
		r["expect"] = *expect
	}
	if ops == 0 {
		return r, fmt.Errorf("no listing succeeded")
	}
	if n := mismatch.Load(); n > 0 {
		return r, fmt.Errorf("%d listings did not return --expect %d keys", n, *expect)
	}
	return r, nil
}

// count: Get(prefix, count only) repeatedly.
func runCount(args []string) (result, error) {
	c := newFlags("count", 1, 10*time.Second)
	expect := c.fs.Int64("expect", -1, "fail unless the count is this (-1 = no check)")
	if err := c.parse(args); err != nil {
		return nil, err
	}
	p, err := c.dial(c.conns)
	if err != nil {
		return nil, err
	}
	defer p.close()
	el := &errLog{}
	counts := make([]int64, c.clients)
	h, ops, secs := timedLoop(c.clients, c.duration, el, "count", func(w int) error {
		ctx, cancel := c.ctx()
		defer cancel()
		resp, err := p.get(w).Get(ctx, c.prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return err
		}
		counts[w] = resp.Count
		if *expect >= 0 && resp.Count != *expect {
			return fmt.Errorf("count %d, expected %d", resp.Count, *expect)
		}
		return nil
	})
	r := fill(result{"count": counts[0], "conns": c.conns}, c.clients, h, ops, secs, el)
	if ops == 0 {
		return r, fmt.Errorf("no count succeeded")
	}
	if *expect >= 0 && el.count() > 0 {
		fmt.Fprintf(os.Stderr, "count: expected %d\n", *expect)
		return r, fmt.Errorf("count differs from --expect %d", *expect)
	}
	return r, nil
}
