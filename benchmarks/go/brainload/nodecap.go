package main

// node-capacity: one step of the node-capacity benchmark (benchmarks/capacity.py
// ramps and bisects --nodes over steps). It writes what a Kubernetes cluster
// of --nodes nodes writes to its store, on an open-loop schedule:
//
//   - every node renews its Lease every --renew-interval: kube-apiserver's
//     GuaranteedUpdate, Txn(If ModRevision(k) == seen, Then Put, Else Get),
//     made again on the object the Else returned while a compare fails;
//   - pod creates: Txn(If ModRevision(k) == 0, Then Put);
//   - pod status updates on existing pods, the same GuaranteedUpdate;
//   - events: a create with a lease, one LeaseGrant shared by up to
//     --events-per-lease events (kube-apiserver's lease manager).
//
// Latency runs from each operation's scheduled time: a slow server does not
// slow the schedule, its backlog shows as latency. The step passes when every
// kind's p99 is within --slo-p99 (SIG Scalability's SLO for mutating calls is
// per resource and verb), at least --min-rate-share of the offered rate was
// achieved and at most --max-fail-share of the operations failed.

import (
	"context"
	"fmt"
	"math"
	"os"
	"runtime"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// capKind is one kind of write of the mix.
type capKind int

const (
	kindLease capKind = iota
	kindPodCreate
	kindPodUpdate
	kindEvent
	numKinds
)

var capKindNames = [numKinds]string{"lease", "pod_create", "pod_update", "event"}

// capNamespaces: pods and events are spread over this many namespaces.
const capNamespaces = 10

// compactRevKey is where kube-apiserver's compactor keeps its state (outside its --etcd-prefix).
const compactRevKey = "compact_rev_key"

type capJob struct {
	kind capKind
	idx  int
	at   time.Duration // scheduled, from the start of the window
}

// capShard is a share of the workers' tallies, under its own lock.
type capShard struct {
	mu        sync.Mutex
	lat       [numKinds]*hist // scheduled time to answer, successful ops
	lag       *hist           // scheduled time to the op's start (the client's own lateness)
	ok        [numKinds]int64
	inWindow  [numKinds]int64 // ok and answered by the end of the window plus the SLO bound
	failed    [numKinds]int64
	conflicts [numKinds]int64 // compares that failed and were made again
}

const capShards = 16

// eventLeases hands out the lease an event is created with: one grant shared
// by up to max events, for at most reuse, as kube-apiserver's lease manager does.
type eventLeases struct {
	mu      sync.Mutex
	ttl     int64
	max     int
	reuse   time.Duration
	id      clientv3.LeaseID
	used    int
	since   time.Time
	granted atomic.Int64
}

func (m *eventLeases) get(ctx context.Context, cli *clientv3.Client) (clientv3.LeaseID, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.id != 0 && m.used < m.max && time.Since(m.since) < m.reuse {
		m.used++
		return m.id, nil
	}
	resp, err := cli.Grant(ctx, m.ttl)
	if err != nil {
		return 0, fmt.Errorf("lease grant: %w", err)
	}
	m.id, m.used, m.since = resp.ID, 1, time.Now()
	m.granted.Add(1)
	return m.id, nil
}

// guaranteedUpdate is kube-apiserver's update of an existing object: the
// compare on the mod revision it last saw; when it fails, the Else branch's
// Get is the object as it is now, and the update is made again on it.
// It returns how many compares failed.
func guaranteedUpdate(ctx context.Context, cli *clientv3.Client, key string, rev *atomic.Int64, val string,
	maxTries int) (int64, error) {
	seen := rev.Load()
	var conflicts int64
	for {
		resp, err := cli.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", seen)).
			Then(clientv3.OpPut(key, val)).
			Else(clientv3.OpGet(key)).
			Commit()
		if err != nil {
			return conflicts, err
		}
		if resp.Succeeded {
			rev.Store(resp.Header.Revision)
			return conflicts, nil
		}
		conflicts++
		var kvs int
		if len(resp.Responses) == 1 {
			if rr := resp.Responses[0].GetResponseRange(); rr != nil {
				kvs = len(rr.Kvs)
				if kvs == 1 {
					seen = rr.Kvs[0].ModRevision
				}
			}
		}
		if kvs != 1 {
			return conflicts, fmt.Errorf("update of %s: the Else branch returned %d keys", key, kvs)
		}
		if conflicts >= int64(maxTries) {
			return conflicts, fmt.Errorf("update of %s: %d compares failed", key, conflicts)
		}
	}
}

// createOnly is kube-apiserver's create: Txn(If ModRevision(k) == 0, Then Put).
func createOnly(ctx context.Context, cli *clientv3.Client, key, val string, opts ...clientv3.OpOption) error {
	resp, err := cli.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, val, opts...)).
		Commit()
	if err != nil {
		return err
	}
	if !resp.Succeeded {
		return fmt.Errorf("create of %s: the key exists", key)
	}
	return nil
}

// preloadKeys puts keys (value val) in Txns of batch puts with clients
// goroutines, untimed, and returns each key's mod revision.
func preloadKeys(c *common, p pool, clients, batch int, keys []string, val string, el *errLog) ([]int64, error) {
	revs := make([]int64, len(keys))
	batches := (len(keys) + batch - 1) / batch
	var retries atomic.Int64
	_, ok, _ := countLoop(clients, batches, el, "preload", func(w, b int) error {
		lo, hi := b*batch, min(len(keys), (b+1)*batch)
		ops := make([]clientv3.Op, 0, hi-lo)
		for _, k := range keys[lo:hi] {
			ops = append(ops, clientv3.OpPut(k, val))
		}
		resp, err := commitRetrying(c, p.get(w), ops, el, "preload", &retries)
		if err != nil {
			return err
		}
		for i := lo; i < hi; i++ {
			revs[i] = resp.Header.Revision
		}
		return nil
	})
	if int(ok) != batches {
		return revs, fmt.Errorf("preload: %d of %d Txns failed", batches-int(ok), batches)
	}
	return revs, nil
}

// apiserverCompactor compacts as kube-apiserver's compactor does, every
// interval: Txn(If Version(compact_rev_key) == t, Then Put(compact_rev_key,
// rev), Else Get), and when it won, Compact(rev), where rev is the revision
// the previous round saw. Its first round runs at once (the steady state of a
// long-running apiserver: the first compaction comes one interval later).
type apiserverCompactor struct {
	done     int
	errors   int
	lastErr  string
	latency  *hist
	compacts []int64
}

func (a *apiserverCompactor) run(ctx context.Context, c *common, cli *clientv3.Client, every time.Duration) {
	var t, rev int64
	tick := time.NewTicker(every)
	defer tick.Stop()
	for ctx.Err() == nil {
		t, rev = a.round(ctx, c, cli, t, rev)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (a *apiserverCompactor) round(ctx context.Context, c *common, cli *clientv3.Client, t, rev int64) (int64, int64) {
	octx, cancel := context.WithTimeout(ctx, c.opTimeout)
	defer cancel()
	resp, err := cli.Txn(octx).
		If(clientv3.Compare(clientv3.Version(compactRevKey), "=", t)).
		Then(clientv3.OpPut(compactRevKey, fmt.Sprint(rev))).
		Else(clientv3.OpGet(compactRevKey)).
		Commit()
	if err != nil {
		a.fail(ctx, err)
		return t, rev
	}
	cur := resp.Header.Revision
	if !resp.Succeeded {
		if rr := resp.Responses[0].GetResponseRange(); rr != nil && len(rr.Kvs) == 1 {
			return rr.Kvs[0].Version, cur
		}
		return t, cur
	}
	if rev == 0 {
		return t + 1, cur // nothing to compact yet
	}
	start := time.Now()
	if _, err := cli.Compact(octx, rev); err != nil {
		a.fail(ctx, err)
		return t + 1, cur
	}
	a.latency.add(time.Since(start))
	a.done++
	a.compacts = append(a.compacts, rev)
	return t + 1, cur
}

// fail counts err, unless the run's end cancelled the round (ctx): a
// compaction cut short by the benchmark's stop is not the server's error.
func (a *apiserverCompactor) fail(ctx context.Context, err error) {
	if ctx.Err() != nil {
		return
	}
	a.errors++
	a.lastErr = err.Error()
	fmt.Fprintf(os.Stderr, "compaction: %v\n", err)
}

func runNodeCapacity(args []string) (result, error) {
	c := newFlags("node-capacity", 1024, 30*time.Second)
	nodes := c.fs.Int("nodes", 0, "nodes of the modelled cluster: each renews its Lease every --renew-interval")
	interval := c.fs.Duration("renew-interval", 10*time.Second, "how often each node renews its Lease")
	leaseSize := c.fs.Int("lease-size", 300, "node Lease value size")
	createRate := c.fs.Float64("pod-create-rate", 50, "pod creates per second")
	updateRate := c.fs.Float64("pod-update-rate", 50, "pod status updates per second (on the --pods existing pods)")
	podSize := c.fs.Int("pod-size", 3072, "pod value size")
	pods := c.fs.Int("pods", 1000, "existing pods (preloaded, untimed) the status updates go round")
	eventRate := c.fs.Float64("event-rate", 100, "event creates per second")
	eventSize := c.fs.Int("event-size", 600, "event value size")
	eventTTL := c.fs.Duration("event-ttl", time.Hour, "TTL of the events' leases")
	perLease := c.fs.Int("events-per-lease", 1000, "events attached to one lease at most")
	reuse := c.fs.Duration("event-lease-reuse", time.Minute, "a lease takes new events for at most this long")
	registry := c.fs.String("registry", "/registry/", "key root (kube-apiserver's --etcd-prefix)")
	epLeases := c.fs.String("endpoints-leases", "", "endpoints of the node Leases (default --endpoints)")
	epPods := c.fs.String("endpoints-pods", "", "endpoints of the pods (default --endpoints)")
	epEvents := c.fs.String("endpoints-events", "", "endpoints of the events and their leases (default --endpoints)")
	drain := c.fs.Duration("drain", 10*time.Second, "after the window, how long the ops already scheduled may take to be answered")
	compactEvery := c.fs.Duration("compact-interval", 5*time.Minute, "kube-apiserver's compaction interval (0: none)")
	sloP99 := c.fs.Duration("slo-p99", time.Second, "the step passes only if every kind's p99 is within this")
	minShare := c.fs.Float64("min-rate-share", 0.97, "... and at least this share of the offered rate was achieved")
	maxFail := c.fs.Float64("max-fail-share", 0.001, "... and at most this share of the operations failed")
	maxTries := c.fs.Int("max-tries", 10, "compares of one update that may fail before the update counts as failed")
	batch := c.fs.Int("preload-batch", 64, "puts per Txn of the preload")
	if err := c.parse(args); err != nil {
		return nil, err
	}
	if *nodes < 1 || *interval <= 0 || *pods < 1 || *batch < 1 || *perLease < 1 || *maxTries < 1 || c.duration <= 0 ||
		*createRate < 0 || *updateRate < 0 || *eventRate < 0 || *eventTTL < time.Second {
		return nil, fmt.Errorf("need --nodes, --pods, --preload-batch, --events-per-lease, --max-tries >= 1, " +
			"--renew-interval and --duration > 0, rates >= 0, --event-ttl >= 1s")
	}
	eps := map[string]string{"leases": *epLeases, "pods": *epPods, "events": *epEvents}
	for k, v := range eps {
		if v == "" {
			eps[k] = c.endpoints
		}
	}
	// One pool per distinct endpoint list: the same servers share connections.
	pools := map[string]pool{}
	for _, e := range []string{eps["leases"], eps["pods"], eps["events"]} {
		if _, ok := pools[e]; ok {
			continue
		}
		p, err := c.dialTo(e, c.conns)
		if err != nil {
			for _, q := range pools {
				q.close()
			}
			return nil, err
		}
		pools[e] = p
	}
	defer func() {
		for _, p := range pools {
			p.close()
		}
	}()
	poolOf := [numKinds]pool{pools[eps["leases"]], pools[eps["pods"]], pools[eps["pods"]], pools[eps["events"]]}

	leaseKeys := make([]string, *nodes)
	for i := range leaseKeys {
		leaseKeys[i] = fmt.Sprintf("%sleases/kube-node-lease/node-%d", *registry, i)
	}
	podKeys := make([]string, *pods)
	for i := range podKeys {
		podKeys[i] = fmt.Sprintf("%spods/ns-%d/pod-%d", *registry, i%capNamespaces, i)
	}
	// Created names carry the run's own token, so a second run on the same server creates new keys.
	runID := strconv.FormatInt(time.Now().UnixNano(), 36)
	leaseVal, podVal, eventVal := randValue(*leaseSize), randValue(*podSize), randValue(*eventSize)
	r := result{"nodes": *nodes, "pods": *pods, "renew_interval_s": interval.Seconds(), "conns": c.conns,
		"clients": c.clients, "window_s": c.duration.Seconds(), "endpoints_by_kind": eps,
		"value_bytes": map[string]int{"lease": *leaseSize, "pod": *podSize, "event": *eventSize},
		"slo": map[string]float64{"p99_ms": float64(*sloP99) / 1e6, "min_rate_share": *minShare,
			"max_fail_share": *maxFail}}

	// The preload (untimed): every node's Lease and the pods the updates go round.
	el := &errLog{}
	t0 := time.Now()
	lrevs, err := preloadKeys(c, poolOf[kindLease], min(c.clients, 32), *batch, leaseKeys, leaseVal, el)
	if err != nil {
		el.into(r)
		return r, err
	}
	prevs, err := preloadKeys(c, poolOf[kindPodUpdate], min(c.clients, 32), *batch, podKeys, podVal, el)
	if err != nil {
		el.into(r)
		return r, err
	}
	r["preload_s"] = round3(time.Since(t0).Seconds())
	leaseRev := make([]atomic.Int64, *nodes)
	for i, v := range lrevs {
		leaseRev[i].Store(v)
	}
	podRev := make([]atomic.Int64, *pods)
	for i, v := range prevs {
		podRev[i].Store(v)
	}

	// The schedule: kind k's n-th op at n/rate[k], for every n with n/rate[k] < the window.
	rates := [numKinds]float64{float64(*nodes) / interval.Seconds(), *createRate, *updateRate, *eventRate}
	var step [numKinds]float64 // ns between two ops of a kind
	var due [numKinds]int64    // ops of each kind the window holds
	total := int64(0)
	for k, rate := range rates {
		if rate > 0 {
			step[k] = 1e9 / rate
			due[k] = int64(math.Ceil(float64(c.duration) / step[k]))
			total += due[k]
		}
	}
	jobs := make(chan capJob, total+1) // the schedule never waits for a worker

	el = &errLog{}
	shards := make([]*capShard, capShards)
	for i := range shards {
		s := &capShard{lag: newHist()}
		for k := range s.lat {
			s.lat[k] = newHist()
		}
		shards[i] = s
	}
	leases := &eventLeases{ttl: int64(eventTTL.Seconds()), max: *perLease, reuse: *reuse}
	runCtx, cancelRun := context.WithCancel(context.Background())
	defer cancelRun()
	grace := c.duration + *sloP99 // an op answered by then counts towards the achieved rate
	var answered atomic.Int64
	var start time.Time
	var wg sync.WaitGroup
	startGate := make(chan struct{})
	for w := 0; w < c.clients; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			<-startGate
			sh := shards[w%capShards]
			for j := range jobs {
				sched := start.Add(j.at)
				lag := time.Since(sched)
				cli := poolOf[j.kind].get(w)
				ctx, cancel := context.WithTimeout(runCtx, c.opTimeout)
				var conflicts int64
				var err error
				switch j.kind {
				case kindLease:
					conflicts, err = guaranteedUpdate(ctx, cli, leaseKeys[j.idx], &leaseRev[j.idx], leaseVal, *maxTries)
				case kindPodUpdate:
					conflicts, err = guaranteedUpdate(ctx, cli, podKeys[j.idx], &podRev[j.idx], podVal, *maxTries)
				case kindPodCreate:
					key := fmt.Sprintf("%spods/ns-%d/created-%s-%d", *registry, j.idx%capNamespaces, runID, j.idx)
					err = createOnly(ctx, cli, key, podVal)
				case kindEvent:
					var id clientv3.LeaseID
					if id, err = leases.get(ctx, cli); err == nil {
						key := fmt.Sprintf("%sevents/ns-%d/event-%s-%d", *registry, j.idx%capNamespaces, runID, j.idx)
						err = createOnly(ctx, cli, key, eventVal, clientv3.WithLease(id))
					}
				}
				cancel()
				if err != nil && runCtx.Err() != nil {
					err = fmt.Errorf("not answered within --drain after the window: %w", err)
				}
				end := time.Now()
				sh.mu.Lock()
				sh.lag.add(max(lag, 0))
				sh.conflicts[j.kind] += conflicts
				if err != nil {
					sh.failed[j.kind]++
				} else {
					sh.ok[j.kind]++
					sh.lat[j.kind].add(end.Sub(sched))
					if end.Sub(start) <= grace {
						sh.inWindow[j.kind]++
					}
				}
				sh.mu.Unlock()
				if err != nil {
					el.add(capKindNames[j.kind], err)
				} else {
					answered.Add(1)
				}
			}
		}(w)
	}

	fmt.Fprintf(os.Stderr, "node-capacity: %d nodes, %.0f ops/s offered for %s\n", *nodes, sum4(rates), c.duration)
	// One compactor per store (the same servers get one), as each apiserver storage backend has.
	var compactors []*apiserverCompactor
	var cwg sync.WaitGroup
	compactCtx, stopCompact := context.WithCancel(runCtx)
	cpu0 := processCPU()
	fmt.Fprintln(os.Stderr, "brainload-phase: timed begin")
	start = time.Now()
	close(startGate)
	if *compactEvery > 0 {
		seen := map[string]bool{}
		for _, e := range []string{eps["leases"], eps["pods"], eps["events"]} {
			if seen[e] {
				continue
			}
			seen[e] = true
			one := &apiserverCompactor{latency: newHist()}
			compactors = append(compactors, one)
			cwg.Add(1)
			go func(cli *clientv3.Client) {
				defer cwg.Done()
				one.run(compactCtx, c, cli, *compactEvery)
			}(pools[e].get(0))
		}
	}
	stop := progress("node-capacity", func() int64 { return answered.Load() })
	var n [numKinds]int64
	for {
		kind := capKind(-1)
		var at float64
		for k := capKind(0); k < numKinds; k++ {
			if n[k] < due[k] && (kind < 0 || float64(n[k])*step[k] < at) {
				kind, at = k, float64(n[k])*step[k]
			}
		}
		if kind < 0 {
			break
		}
		idx := int(n[kind])
		switch kind {
		case kindLease:
			idx %= *nodes
		case kindPodUpdate:
			idx %= *pods
		}
		n[kind]++
		if d := time.Duration(at) - time.Since(start); d > 0 {
			time.Sleep(d)
		}
		jobs <- capJob{kind: kind, idx: idx, at: time.Duration(at)}
	}
	close(jobs)
	if d := c.duration - time.Since(start); d > 0 {
		time.Sleep(d)
	}
	stopCompact()
	// The drain: answers to what was scheduled may come until the window's end plus --drain.
	drained := make(chan struct{})
	go func() { wg.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(time.Until(start.Add(c.duration + *drain))):
		cancelRun() // what is still waiting fails now
		<-drained
	}
	cwg.Wait()
	elapsed := time.Since(start)
	fmt.Fprintln(os.Stderr, "brainload-phase: timed end")
	cpu := processCPU() - cpu0
	stop()

	all, lag := newHist(), newHist()
	var byKind [numKinds]*hist
	var ok, inWindow, failed, conflicts [numKinds]int64
	for k := range byKind {
		byKind[k] = newHist()
	}
	for _, sh := range shards {
		lag.merge(sh.lag)
		for k := range byKind {
			byKind[k].merge(sh.lat[k])
			all.merge(sh.lat[k])
			ok[k] += sh.ok[k]
			inWindow[k] += sh.inWindow[k]
			failed[k] += sh.failed[k]
			conflicts[k] += sh.conflicts[k]
		}
	}
	window := c.duration.Seconds()
	perKind := func(f func(k int) any) map[string]any {
		m := map[string]any{}
		for k := range capKindNames {
			m[capKindNames[k]] = f(k)
		}
		return m
	}
	var okAll, inAll, failAll, dueAll int64
	for k := range capKindNames {
		okAll += ok[k]
		inAll += inWindow[k]
		failAll += failed[k]
		dueAll += due[k]
	}
	target := sum4(rates)
	achieved := float64(inAll) / window
	r["target_per_s"] = perKind(func(k int) any { return round3(rates[k]) })
	r["target_per_s"].(map[string]any)["total"] = round3(target)
	r["achieved_per_s"] = perKind(func(k int) any { return round3(float64(inWindow[k]) / window) })
	r["achieved_per_s"].(map[string]any)["total"] = round3(achieved)
	r["scheduled"] = perKind(func(k int) any { return due[k] })
	r["scheduled"].(map[string]any)["total"] = dueAll
	r["succeeded"] = perKind(func(k int) any { return ok[k] })
	r["failures"] = perKind(func(k int) any { return failed[k] })
	r["failures"].(map[string]any)["total"] = failAll
	r["conflicts"] = perKind(func(k int) any { return conflicts[k] })
	r["latency_ms_by_kind"] = perKind(func(k int) any { return byKind[k].tail() })
	r["schedule_lag_ms"] = lag.tail()
	r["event_leases_granted"] = leases.granted.Load()
	compactor := &apiserverCompactor{latency: newHist()}
	for _, one := range compactors {
		compactor.merge(one)
	}
	r["compactions"] = map[string]any{"interval_s": compactEvery.Seconds(), "done": compactor.done,
		"errors": compactor.errors, "revisions": compactor.compacts, "latency_ms": compactor.latency.summary()}
	if compactor.lastErr != "" {
		r["compactions"].(map[string]any)["last_error"] = compactor.lastErr
	}
	r["client_cpu_s"] = round3(cpu)
	r["cpus"] = runtime.NumCPU()
	if elapsed > 0 {
		r["client_cpu_share"] = round3(cpu / (elapsed.Seconds() * float64(runtime.NumCPU())))
	}
	fill(r, c.clients, all, okAll, elapsed.Seconds(), el)
	r["latency_ms"] = all.tail()
	r["ops_per_s"] = round3(achieved)
	r["offered_per_s"] = round3(target)

	// The verdict.
	why := []string{}
	for k := range capKindNames {
		if due[k] == 0 {
			continue
		}
		if ok[k] == 0 {
			why = append(why, fmt.Sprintf("no %s succeeded", capKindNames[k]))
		} else if p99 := byKind[k].quantileUs(0.99) * 1e3; p99 > float64(*sloP99) {
			why = append(why, fmt.Sprintf("%s p99 %.0f ms > %.0f ms", capKindNames[k], p99/1e6, float64(*sloP99)/1e6))
		}
	}
	if achieved < *minShare*target {
		why = append(why, fmt.Sprintf("achieved %.1f of %.1f ops/s (%.1f%% < %.1f%%)", achieved, target,
			100*achieved/target, 100**minShare))
	}
	if float64(failAll) > *maxFail*float64(dueAll) {
		why = append(why, fmt.Sprintf("%d of %d ops failed (%.2f%% > %.2f%%)", failAll, dueAll,
			100*float64(failAll)/float64(max(dueAll, 1)), 100**maxFail))
	}
	sort.Strings(why)
	r["pass"] = len(why) == 0
	r["fail_reasons"] = why
	fmt.Fprintf(os.Stderr, "node-capacity: %d nodes: %.1f of %.1f ops/s, p99 %.1f ms, %d failed: %s\n",
		*nodes, achieved, target, all.quantileUs(0.99)/1e3, failAll, map[bool]string{true: "pass", false: "FAIL"}[len(why) == 0])
	if okAll == 0 {
		return r, fmt.Errorf("no operation succeeded")
	}
	return r, nil
}

func (a *apiserverCompactor) merge(o *apiserverCompactor) {
	a.done += o.done
	a.errors += o.errors
	if o.lastErr != "" {
		a.lastErr = o.lastErr
	}
	a.latency.merge(o.latency)
	a.compacts = append(a.compacts, o.compacts...)
}

func sum4(xs [numKinds]float64) float64 {
	var s float64
	for _, x := range xs {
		s += x
	}
	return s
}
