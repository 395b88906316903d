package main

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// mutex: --clients goroutines take one concurrency.Mutex, read a counter,
// write it back plus one, and release the mutex, for --duration. Mutual
// exclusion holds only if no increment is lost: at the end the counter must
// be between the acknowledged increments and those plus the increments whose
// outcome is unknown. The plain read-then-put (no compare on the counter) is
// deliberate: only the mutex keeps two increments from overwriting each
// other.
//
// The write is fenced by default: Txn(If(IsOwner), Then(Put)), what careful
// clients do. A write whose outcome is unknown may still be in flight (queued
// on a member that forwards it later) after its client gave up and released
// the mutex; unfenced, it would land late and overwrite a newer count, a
// false alarm on a correct system. Fenced, it is refused once the lock key is
// gone, while two clients that both hold the mutex still both pass IsOwner
// and lose an increment. --fenced=false is for runs without faults.
//
// Also reported: pairs of clients whose held intervals (from Lock returning
// to Unlock being called) overlap in real time while both increments were
// acknowledged: two clients that each held the mutex at one instant, a
// violation by itself; and the counter's reads and writes whose header
// revisions are out of real-time order (order.go).

type holdInterval struct {
	client     int
	start, end time.Time
	ok         bool // the increment was acknowledged
}

func runMutex(args []string) (result, error) {
	c := newFlags("mutex", 10*time.Second)
	clients := c.fs.Int("clients", 4, "concurrent clients, each with its own connection(s) and session")
	ttl := c.fs.Int("session-ttl", 10, "session lease TTL in seconds: a holder that stops renewing loses the mutex after this")
	lockTimeout := c.fs.Duration("lock-timeout", 10*time.Second, "how long one Lock call may wait")
	fenced := c.fs.Bool("fenced", true, "write the counter in Txn(If(IsOwner)) so a client that lost its lock is refused (false: a plain Put)")
	if err := c.parse(args); err != nil {
		return nil, err
	}
	if *clients < 1 {
		return nil, fmt.Errorf("%w: --clients must be >= 1", errUsage)
	}
	counterKey := c.prefix + "counter"
	lockPrefix := c.prefix + "lock/"

	conns, err := c.dialClients(*clients)
	if err != nil {
		return nil, err
	}
	defer closeAll(conns)
	if _, err := c.clearPrefix(conns[0]); err != nil {
		return nil, err
	}

	var errs errLog
	var mu sync.Mutex
	var holds []holdInterval
	var revs revLog
	var increments, unknown, refused, locks int64
	start := time.Now()
	deadline := start.Add(c.duration)
	c.watchStopFile(deadline)
	var wg sync.WaitGroup
	for i := 0; i < *clients; i++ {
		wg.Add(1)
		go func(id int) {
			defer wg.Done()
			cli := conns[id]
			var sess *concurrency.Session
			// newSession drops a session that may still hold a key under
			// the lock prefix (an Unlock that failed): orphaning stops its
			// keepalives, so its key goes away after the TTL, and the next
			// Lock does not wait behind this client's own stale key.
			dropSession := func() {
				if sess != nil {
					sess.Orphan()
					sess = nil
				}
			}
			defer func() {
				if sess != nil {
					sess.Close()
				}
			}()
			for c.issuing(deadline) {
				if sess != nil {
					select {
					case <-sess.Done():
						errs.add("session", fmt.Errorf("session lease expired or lost"))
						dropSession()
					default:
					}
				}
				if sess == nil {
					s, err := concurrency.NewSession(cli, concurrency.WithTTL(*ttl))
					if err != nil {
						errs.add("session", err)
						time.Sleep(100 * time.Millisecond)
						continue
					}
					sess = s
				}
				m := concurrency.NewMutex(sess, lockPrefix)
				lctx, lcancel := context.WithTimeout(context.Background(), *lockTimeout)
				err := m.Lock(lctx)
				lcancel()
				if err != nil {
					errs.add("lock", err)
					dropSession()
					continue
				}
				held := holdInterval{client: id, start: time.Now()}
				mu.Lock()
				locks++
				mu.Unlock()
				done := incrementOnce(c, cli, id, m, counterKey, *fenced, &errs, &revs)
				held.end = time.Now()
				held.ok = done == incOK
				mu.Lock()
				holds = append(holds, held)
				switch done {
				case incOK:
					increments++
				case incUnknown:
					unknown++
				case incRefused:
					refused++
				}
				mu.Unlock()
				uctx, ucancel := c.ctx()
				err = m.Unlock(uctx)
				ucancel()
				if err != nil {
					errs.add("unlock", err)
					dropSession()
				}
			}
		}(i)
	}
	wg.Wait()
	runSeconds := time.Since(start).Seconds()

	r := result{
		"clients":     *clients,
		"fenced":      *fenced,
		"locks":       locks,
		"increments":  increments,
		"unknown":     unknown,
		"refused":     refused,
		"run_seconds": runSeconds,
	}
	errs.into(r)
	if increments == 0 {
		return r, fmt.Errorf("no increment was acknowledged in %.1f s", runSeconds)
	}
	// The final count: retried, since the cluster may still be electing.
	var counter int64 = -1
	var lastErr error
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); {
		ctx, cancel := c.ctx()
		g, err := conns[0].Get(ctx, counterKey)
		cancel()
		if err == nil {
			counter = 0
			if len(g.Kvs) > 0 {
				counter, err = strconv.ParseInt(string(g.Kvs[0].Value), 10, 64)
			}
			if err == nil {
				break
			}
		}
		lastErr = err
		time.Sleep(200 * time.Millisecond)
	}
	if counter < 0 {
		return r, fmt.Errorf("reading the final counter: %v", lastErr)
	}
	overlaps, overlapSample := overlappingHolds(holds)
	countOK := counter >= increments && counter <= increments+unknown
	violations := overlaps + orderInto(r, revs.ops)
	if !countOK {
		violations++
	}
	r["counter"] = counter
	r["counter_ok"] = countOK
	r["overlaps"] = overlaps
	r["overlap_sample"] = overlapSample
	r["violations"] = violations
	return r, nil
}

type incOutcome int

const (
	incFailed  incOutcome = iota // nothing written (the read failed)
	incOK                        // the counter write was acknowledged
	incUnknown                   // the counter write's outcome is unknown
	incRefused                   // --fenced: the write was refused, the lock was lost
)

// incrementOnce reads the counter and writes it back plus one; the answered
// calls go to revs with their header revisions.
func incrementOnce(c *common, cli *clientv3.Client, id int, m *concurrency.Mutex, key string, fenced bool,
	errs *errLog, revs *revLog) incOutcome {
	ctx, cancel := c.ctx()
	defer cancel()
	call := time.Now()
	r, err := cli.Get(ctx, key)
	if err != nil {
		errs.add("get", err)
		return incFailed
	}
	revs.add(revOp{What: "get(counter)", Client: id, Call: since(call), Ret: since(time.Now()), Rev: r.Header.Revision})
	var n int64
	if len(r.Kvs) > 0 {
		if n, err = strconv.ParseInt(string(r.Kvs[0].Value), 10, 64); err != nil {
			errs.add("get", fmt.Errorf("counter value %q: %w", r.Kvs[0].Value, err))
			return incFailed
		}
	}
	val := strconv.FormatInt(n+1, 10)
	if fenced {
		call = time.Now()
		tr, err := cli.Txn(ctx).If(m.IsOwner()).Then(clientv3.OpPut(key, val)).Commit()
		if err != nil {
			errs.add("put", err)
			return incUnknown
		}
		revs.add(revOp{What: fmt.Sprintf("txn(if owner: put counter %s) -> %v", val, tr.Succeeded), Client: id,
			Call: since(call), Ret: since(time.Now()), Rev: tr.Header.Revision})
		if !tr.Succeeded {
			errs.add("put", fmt.Errorf("refused: this client no longer owns the lock"))
			return incRefused
		}
		return incOK
	}
	call = time.Now()
	pr, err := cli.Put(ctx, key, val)
	if err != nil {
		errs.add("put", err)
		return incUnknown
	}
	revs.add(revOp{What: "put(counter " + val + ")", Client: id, Call: since(call), Ret: since(time.Now()),
		Rev: pr.Header.Revision})
	return incOK
}

// overlappingHolds counts pairs of acknowledged increments, of different
// clients, whose held intervals overlap (two clients that both knew they held
// the mutex at one instant), with the first few as a sample.
func overlappingHolds(holds []holdInterval) (int, []map[string]any) {
	sort.Slice(holds, func(i, j int) bool { return holds[i].start.Before(holds[j].start) })
	n := 0
	out := []map[string]any{}
	for i := range holds {
		for j := i + 1; j < len(holds) && holds[j].start.Before(holds[i].end); j++ {
			if holds[j].client == holds[i].client || !holds[i].ok || !holds[j].ok {
				continue
			}
			n++
			if len(out) < 20 {
				out = append(out, map[string]any{
					"a": holds[i].client, "a_t": [2]float64{since(holds[i].start), since(holds[i].end)},
					"b": holds[j].client, "b_t": [2]float64{since(holds[j].start), since(holds[j].end)},
				})
			}
		}
	}
	return n, out
}
