package main

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// k8s-mix: what a large Kubernetes cluster's steady state writes. --nodes
// node Lease objects renewed every --renew-interval each, spread evenly, and
// --pod-rate pod status updates per second round-robin over --pods pods;
// both with the apiserver's optimistic update (txn-put shape). The ops are
// issued on a fixed schedule (open loop) to --clients workers; an op that
// starts more than --late after its scheduled time is off schedule.
func runK8sMix(args []string) (result, error) {
	c := newFlags("k8s-mix", 128, 30*time.Second)
	nodes := c.fs.Int("nodes", 10000, "node leases")
	interval := c.fs.Duration("renew-interval", 10*time.Second, "each node lease is renewed this often")
	leaseSize := c.fs.Int("lease-size", 300, "node lease value size")
	pods := c.fs.Int("pods", 30000, "pods")
	podRate := c.fs.Float64("pod-rate", 500, "pod status updates per second")
	podSize := c.fs.Int("pod-size", 4096, "pod value size")
	root := c.fs.String("registry", "/registry/", "key root (kube-apiserver's --etcd-prefix)")
	late := c.fs.Duration("late", 100*time.Millisecond, "an op that starts later than this after its schedule is off schedule")
	if err := c.parse(args); err != nil {
		return nil, err
	}
	if *nodes < 0 || *pods < 0 || *podRate < 0 || *interval <= 0 || (*nodes == 0 && (*pods == 0 || *podRate == 0)) {
		return nil, fmt.Errorf("need --nodes > 0, or --pods > 0 and --pod-rate > 0; --renew-interval > 0")
	}
	if *pods == 0 {
		*podRate = 0
	}
	p, err := c.dial(c.conns)
	if err != nil {
		return nil, err
	}
	defer p.close()

	leaseKeys := make([]string, *nodes)
	for i := range leaseKeys {
		leaseKeys[i] = fmt.Sprintf("%sleases/kube-node-lease/node-%d", *root, i)
	}
	podKeys := make([]string, *pods)
	for i := range podKeys {
		podKeys[i] = fmt.Sprintf("%spods/default/pod-%d", *root, i)
	}
	leaseVal, podVal := randValue(*leaseSize), randValue(*podSize)
	r := result{"nodes": *nodes, "pods": *pods, "renew_interval_s": interval.Seconds(), "conns": c.conns}
	el := &errLog{}
	lrevs, err := preload(p, c, min(c.clients, 32), leaseKeys, func(int) string { return leaseVal }, el)
	if err != nil {
		el.into(r)
		return r, err
	}
	prevs, err := preload(p, c, min(c.clients, 32), podKeys, func(int) string { return podVal }, el)
	if err != nil {
		el.into(r)
		return r, err
	}
	leaseRev := make([]atomic.Int64, *nodes)
	for i, v := range lrevs {
		leaseRev[i].Store(v)
	}
	podRev := make([]atomic.Int64, *pods)
	for i, v := range prevs {
		podRev[i].Store(v)
	}

	type job struct {
		pod   bool
		idx   int
		sched time.Time
	}
	el = &errLog{}
	jobs := make(chan job)
	type stat struct {
		lease, pod, all, lag *hist
		leases, podUps       int64
		onTime, conflicts    int64
	}
	stats := make([]*stat, c.clients)
	var wg sync.WaitGroup
	var doneOps atomic.Int64
	for w := 0; w < c.clients; w++ {
		st := &stat{lease: newHist(), pod: newHist(), all: newHist(), lag: newHist()}
		stats[w] = st
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			cli := p.get(w)
			for j := range jobs {
				start := time.Now()
				lag := start.Sub(j.sched)
				st.lag.add(max(lag, 0))
				if lag <= *late {
					st.onTime++
				}
				key, val, rev := leaseKeys[j.idx%max(*nodes, 1)], leaseVal, (*atomic.Int64)(nil)
				if j.pod {
					key, val, rev = podKeys[j.idx], podVal, &podRev[j.idx]
				} else {
					rev = &leaseRev[j.idx]
				}
				ok, newRev, err := txnPut(c, cli, key, rev.Load(), val)
				if err != nil {
					el.add(map[bool]string{false: "lease renewal", true: "pod update"}[j.pod], err)
					continue
				}
				rev.Store(newRev)
				if !ok {
					st.conflicts++
				}
				d := time.Since(start)
				st.all.add(d)
				if j.pod {
					st.pod.add(d)
					st.podUps++
				} else {
					st.lease.add(d)
					st.leases++
				}
				doneOps.Add(1)
			}
		}(w)
	}

	// The schedule: lease k at k*interval/nodes (node k % nodes), pod update
	// j at j/podRate (pod j % pods); issue whichever is due first.
	start := time.Now()
	var leaseStep, podStep time.Duration
	if *nodes > 0 {
		leaseStep = time.Duration(float64(*interval) / float64(*nodes))
	}
	if *podRate > 0 {
		podStep = time.Duration(1e9 / *podRate)
	}
	var k, j int64
	var scheduled, scheduledLease, scheduledPod int64
	stop := progress("k8s-mix", func() int64 { return doneOps.Load() })
	for {
		lt, pt := time.Duration(-1), time.Duration(-1)
		if leaseStep > 0 {
			lt = time.Duration(k) * leaseStep
		}
		if podStep > 0 {
			pt = time.Duration(j) * podStep
		}
		var jb job
		var at time.Duration
		if lt >= 0 && (pt < 0 || lt <= pt) {
			at, jb = lt, job{pod: false, idx: int(k % int64(*nodes))}
			k++
		} else {
			at, jb = pt, job{pod: true, idx: int(j % int64(*pods))}
			j++
		}
		if at >= c.duration {
			break
		}
		jb.sched = start.Add(at)
		if d := time.Until(jb.sched); d > 0 {
			time.Sleep(d)
		}
		if time.Since(start) >= c.duration {
			break // running so late that the window is over
		}
		jobs <- jb
		scheduled++
		if jb.pod {
			scheduledPod++
		} else {
			scheduledLease++
		}
	}
	close(jobs)
	wg.Wait()
	stop()
	secs := time.Since(start).Seconds()

	all, lh, ph, lag := newHist(), newHist(), newHist(), newHist()
	var leases, podUps, onTime, conflicts int64
	for _, st := range stats {
		all.merge(st.all)
		lh.merge(st.lease)
		ph.merge(st.pod)
		lag.merge(st.lag)
		leases += st.leases
		podUps += st.podUps
		onTime += st.onTime
		conflicts += st.conflicts
	}
	window := c.duration.Seconds()
	// Ops the schedule had due in the window but never issued count as late.
	due := int64(float64(*nodes)/interval.Seconds()*window) + int64(*podRate*window)
	fill(r, c.clients, all, leases+podUps, secs, el)
	r["renewals"] = leases
	r["renewals_per_s"] = round3(float64(leases) / window)
	r["renewals_target_per_s"] = round3(float64(*nodes) / interval.Seconds())
	r["pod_updates"] = podUps
	r["pod_updates_per_s"] = round3(float64(podUps) / window)
	r["pod_target_per_s"] = *podRate
	r["lease_latency_ms"] = lh.summary()
	r["pod_latency_ms"] = ph.summary()
	r["lag_ms"] = lag.summary()
	r["scheduled"] = scheduled
	r["due"] = max(due, scheduled)
	if d := max(due, scheduled); d > 0 {
		r["on_schedule"] = round3(float64(onTime) / float64(d))
	}
	r["conflicts"] = conflicts
	if leases+podUps == 0 {
		return r, fmt.Errorf("no update succeeded")
	}
	fmt.Fprintf(os.Stderr, "k8s-mix: %d renewals, %d pod updates in %.1f s, %.1f%% on schedule\n",
		leases, podUps, window, 100*float64(onTime)/float64(max(due, scheduled, 1)))
	return r, nil
}
