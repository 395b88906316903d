package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// watch: one watcher on --endpoints (give it one member, a follower) over
// --prefix from --start-rev, for --duration. It checks what it receives by
// itself: events arrive in revision order and no (revision, key) arrives
// twice. With --acked (the write mode's --record file, written when the
// writer ends) it then goes on watching until it has every acknowledged
// revision at or above --start-rev, or --settle runs out, and reports each
// one it never received: a watcher must not lose an event across a leader
// change.
//
// The client resumes a broken watch stream from the revision after the last
// event it delivered, as every etcd client does; a watch cancelled by the
// server (compaction, or anything else) ends the run with a failure.

func runWatch(args []string) (result, error) {
	c := newFlags("watch", 10*time.Second)
	startRev := c.fs.Int64("start-rev", 0, "revision to watch from (0: the revision after the current one)")
	acked := c.fs.String("acked", "", "the write mode's --record file: every acknowledged revision must be received")
	settle := c.fs.Duration("settle", 30*time.Second, "after --duration, how long to wait for the --acked file and the events still missing")
	threshold := c.fs.Duration("pause-threshold", 500*time.Millisecond, "report every gap between received events longer than this")
	if err := c.parse(args); err != nil {
		return nil, err
	}
	cli, err := c.dial()
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	if *startRev == 0 {
		ctx, cancel := c.ctx()
		r, err := cli.Get(ctx, c.prefix+"watch-start")
		cancel()
		if err != nil {
			return nil, fmt.Errorf("reading the current revision: %w", err)
		}
		*startRev = r.Header.Revision + 1
	}

	type seenEvent struct {
		key string
		at  float64
	}
	seen := map[int64][]seenEvent{}
	var lastRev int64
	var times []float64
	outOfOrder, duplicates := 0, 0
	var problems []string
	note := func(format string, a ...any) {
		if len(problems) < 20 {
			problems = append(problems, fmt.Sprintf(format, a...))
		}
	}

	// No WithRequireLeader: a watcher on a follower keeps its stream
	// through an election, which is what this checks.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wch := cli.Watch(ctx, c.prefix, clientv3.WithPrefix(), clientv3.WithRev(*startRev))
	start := time.Now()
	stopAt := start.Add(c.duration)
	var rec *writeRecord
	var want map[int64]string // acknowledged revision -> key, once --acked is read
	missingNow := func() int {
		n := 0
		for rev := range want {
			if _, ok := seen[rev]; !ok {
				n++
			}
		}
		return n
	}
	settleEnd := stopAt.Add(*settle)
	c.watchStopFile(stopAt)
	var failure error
	responses := 0
loop:
	for {
		now := time.Now()
		if c.stopped.Load() && now.Before(stopAt) {
			// --stop-file: the writer is done too; its record comes next
			stopAt, settleEnd = now, now.Add(*settle)
		}
		if !now.Before(stopAt) {
			if *acked == "" {
				break
			}
			if rec == nil {
				if r, err := readRecord(*acked); err == nil {
					rec = r
					want = map[int64]string{}
					for _, a := range rec.Acked {
						if a.Rev >= *startRev {
							want[a.Rev] = a.Key
						}
					}
				} else if !errors.Is(err, os.ErrNotExist) {
					failure = err
					break
				}
			}
			if rec != nil && missingNow() == 0 {
				break
			}
			if !now.Before(settleEnd) {
				break
			}
		}
		timer := time.NewTimer(100 * time.Millisecond)
		select {
		case resp, ok := <-wch:
			timer.Stop()
			if !ok {
				failure = fmt.Errorf("the watch channel closed")
				break loop
			}
			if err := resp.Err(); err != nil {
				failure = fmt.Errorf("watch ended by the server: %w (compact revision %d)", err, resp.CompactRevision)
				break loop
			}
			if resp.Canceled {
				failure = fmt.Errorf("watch cancelled by the server")
				break loop
			}
			responses++
			at := since(time.Now())
			for _, ev := range resp.Events {
				rev := ev.Kv.ModRevision
				key := string(ev.Kv.Key)
				if rev < lastRev {
					outOfOrder++
					note("revision %d (%s) arrived after revision %d", rev, key, lastRev)
				}
				for _, e := range seen[rev] {
					if e.key == key {
						duplicates++
						note("revision %d (%s) arrived twice, at %.3f s and %.3f s", rev, key, e.at, at)
					}
				}
				seen[rev] = append(seen[rev], seenEvent{key, at})
				lastRev = max(lastRev, rev)
				times = append(times, at)
			}
		case <-timer.C:
		}
	}
	runSeconds := time.Since(start).Seconds()

	events := 0
	for _, evs := range seen {
		events += len(evs)
	}
	r := result{
		"start_rev":    *startRev,
		"last_rev":     lastRev,
		"events":       events,
		"responses":    responses,
		"run_seconds":  runSeconds,
		"out_of_order": outOfOrder,
		"duplicates":   duplicates,
	}
	violations := outOfOrder + duplicates
	if *acked != "" {
		if rec == nil && failure == nil {
			failure = fmt.Errorf("%s did not appear within --settle %s after the run", *acked, *settle)
		}
		missing, wrongKey := 0, 0
		var missingRevs []int64
		for rev, key := range want {
			evs, ok := seen[rev]
			if !ok {
				missing++
				missingRevs = append(missingRevs, rev)
				continue
			}
			if len(evs) != 1 || evs[0].key != key {
				wrongKey++
				note("acknowledged revision %d is %s, the watch delivered %v at it", rev, key, evs)
			}
		}
		sort.Slice(missingRevs, func(i, j int) bool { return missingRevs[i] < missingRevs[j] })
		for _, rev := range missingRevs {
			note("acknowledged revision %d (%s) never arrived", rev, want[rev])
		}
		r["acked_watched"] = len(want)
		r["missing"] = missing
		r["wrong_key"] = wrongKey
		violations += missing + wrongKey
	}
	gaps := [][3]float64{}
	var longest [3]float64
	prev := since(start)
	for _, t := range times {
		if g := t - prev; g > threshold.Seconds() {
			gaps = append(gaps, [3]float64{prev, t, g})
		}
		if t-prev > longest[2] {
			longest = [3]float64{prev, t, t - prev}
		}
		prev = t
	}
	r["longest_pause_s"] = longest[2]
	r["longest_pause"] = longest
	r["pauses"] = gaps
	if problems == nil {
		problems = []string{}
	}
	r["problems"] = problems
	r["violations"] = violations
	return r, failure
}
