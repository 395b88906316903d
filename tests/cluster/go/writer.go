package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// write: puts unique keys (<prefix><seq>) at --rate writes per second,
// open loop, over --clients connections for --duration, and records every
// acknowledged write with its revision and times. A write that fails is
// never retried under the same key: its key may or may not exist afterwards
// (an unknown outcome) and is recorded as such.
//
// It reports the write pauses (the longest time without an acknowledged
// write, and every gap above --pause-threshold with its window) and checks,
// from the client's side, that revisions never go back: a write called
// after another was acknowledged must get a higher revision, and no two
// acknowledged writes share one.
//
// verify: reads the prefix back (after the run, possibly after restarts) and
// checks every acknowledged write of a --record file is there with its
// revision as mod and create revision, no key exists that was never written,
// and the cluster's revision is not behind the highest acknowledged one.

// ackedWrite is [key, revision, call time, ack time] in the record file
// (times in seconds since the writer's start_unix).
type ackedWrite struct {
	Key  string
	Rev  int64
	Call float64
	Ack  float64
}

func (a ackedWrite) MarshalJSON() ([]byte, error) {
	return json.Marshal([]any{a.Key, a.Rev, a.Call, a.Ack})
}

func (a *ackedWrite) UnmarshalJSON(b []byte) error {
	var raw []any
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	if len(raw) != 4 {
		return fmt.Errorf("acked write %s: want [key, rev, call, ack]", b)
	}
	key, ok0 := raw[0].(string)
	rev, ok1 := raw[1].(float64)
	call, ok2 := raw[2].(float64)
	ack, ok3 := raw[3].(float64)
	if !ok0 || !ok1 || !ok2 || !ok3 {
		return fmt.Errorf("acked write %s: want [key, rev, call, ack]", b)
	}
	*a = ackedWrite{key, int64(rev), call, ack}
	return nil
}

// writeRecord is the --record file: what verify and watch --acked read.
type writeRecord struct {
	Prefix    string       `json:"prefix"`
	StartUnix float64      `json:"start_unix"`
	Duration  float64      `json:"duration"`
	Acked     []ackedWrite `json:"acked"`
	Unknown   []string     `json:"unknown"` // keys whose write has an unknown outcome
}

func readRecord(path string) (*writeRecord, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var rec writeRecord
	if err := json.Unmarshal(data, &rec); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &rec, nil
}

func runWrite(args []string) (result, error) {
	c := newFlags("write", 10*time.Second)
	clients := c.fs.Int("clients", 16, "connections (--rate > 0: writes go round-robin over them; 0: one closed-loop writer each)")
	rate := c.fs.Float64("rate", 1000, "writes started per second in total, open loop (0: closed loop, each client writes as fast as answers come)")
	maxInflight := c.fs.Int("max-inflight", 1024, "open loop: at most this many writes in flight (a write due beyond it is skipped)")
	valSize := c.fs.Int("val-size", 64, "value size in bytes")
	record := c.fs.String("record", "", "write the record of acknowledged writes here (JSON, for verify and watch --acked)")
	threshold := c.fs.Duration("pause-threshold", 500*time.Millisecond, "report every gap between acknowledged writes longer than this")
	if err := c.parse(args); err != nil {
		return nil, err
	}
	if *clients < 1 || *maxInflight < 1 {
		return nil, fmt.Errorf("%w: --clients and --max-inflight must be >= 1", errUsage)
	}
	if !strings.HasSuffix(c.prefix, "/") {
		return nil, fmt.Errorf("%w: --prefix must end with /", errUsage)
	}
	conns, err := c.dialClients(*clients)
	if err != nil {
		return nil, err
	}
	defer closeAll(conns)
	value := strings.Repeat("v", *valSize)

	var errs errLog
	var mu sync.Mutex
	var acked []ackedWrite
	var unknown []string
	var seq atomic.Int64
	// put writes the next unique key through cli and records the outcome.
	put := func(cli *clientv3.Client) {
		n := seq.Add(1)
		key := fmt.Sprintf("%s%09d", c.prefix, n)
		call := time.Now()
		ctx, cancel := c.ctx()
		r, err := cli.Put(ctx, key, value)
		cancel()
		ack := time.Now()
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			unknown = append(unknown, key)
			errs.add("put", err)
			return
		}
		acked = append(acked, ackedWrite{key, r.Header.Revision, since(call), since(ack)})
	}

	start := time.Now()
	deadline := start.Add(c.duration)
	c.watchStopFile(deadline)
	var wg sync.WaitGroup
	skipped := 0
	if *rate > 0 {
		// Open loop: a write starts every 1/rate s whatever the earlier
		// ones are doing (up to --max-inflight), so the first write to
		// succeed after a fault shows when the cluster took writes again,
		// not when the requests stuck on the dead member timed out.
		interval := time.Duration(float64(time.Second) / *rate)
		sem := make(chan struct{}, *maxInflight)
		for i, next := 0, start; next.Before(deadline) && c.issuing(deadline); i, next = i+1, next.Add(interval) {
			time.Sleep(time.Until(next))
			select {
			case sem <- struct{}{}:
				wg.Add(1)
				go func(cli *clientv3.Client) {
					defer wg.Done()
					put(cli)
					<-sem
				}(conns[i%len(conns)])
			default:
				skipped++
			}
		}
	} else {
		for i := range conns {
			wg.Add(1)
			go func(cli *clientv3.Client) {
				defer wg.Done()
				for c.issuing(deadline) {
					put(cli)
				}
			}(conns[i])
		}
	}
	wg.Wait()
	end := time.Now()
	runSeconds := end.Sub(start).Seconds()

	sort.Slice(acked, func(i, j int) bool { return acked[i].Ack < acked[j].Ack })
	sort.Strings(unknown)
	r := result{
		"clients":     *clients,
		"rate":        *rate,
		"acked":       len(acked),
		"unknown":     len(unknown),
		"run_seconds": runSeconds,
		"acked_per_s": float64(len(acked)) / runSeconds,
		"skipped":     skipped,
		"record":      *record,
	}
	errs.into(r)
	pauses(r, acked, since(start), since(end), threshold.Seconds())
	violations := revisionOrder(r, acked)
	r["violations"] = violations
	var failure error
	if len(acked) == 0 {
		failure = fmt.Errorf("no write was acknowledged in %.1f s", runSeconds)
	}
	if *record != "" {
		rec := writeRecord{Prefix: c.prefix, StartUnix: float64(processStart.UnixNano()) / 1e9,
			Duration: runSeconds, Acked: acked, Unknown: unknown}
		if rec.Unknown == nil {
			rec.Unknown = []string{}
		}
		data, err := json.Marshal(rec)
		if err == nil {
			err = writeFileAtomic(*record, data)
		}
		if err != nil {
			return r, fmt.Errorf("writing %s: %w", *record, err)
		}
	}
	return r, failure
}

// pauses records the longest gap between acknowledged writes (acked sorted
// by ack time), counting from the start of the run and up to its end, and
// every gap above threshold: [from, to, seconds], times relative to
// start_unix.
func pauses(r result, acked []ackedWrite, start, end, threshold float64) {
	times := make([]float64, 0, len(acked)+2)
	times = append(times, start)
	for _, a := range acked {
		times = append(times, a.Ack)
	}
	times = append(times, end)
	list := [][3]float64{}
	var longest [3]float64
	for i := 1; i < len(times); i++ {
		gap := [3]float64{times[i-1], times[i], times[i] - times[i-1]}
		if gap[2] > longest[2] {
			longest = gap
		}
		if gap[2] > threshold {
			list = append(list, gap)
		}
	}
	r["longest_pause_s"] = longest[2]
	r["longest_pause"] = longest
	r["pauses"] = list
	r["pause_threshold_s"] = threshold
}

// revisionOrder checks that no two acknowledged writes share a revision and
// that a write called after another was acknowledged got a higher revision.
// acked is sorted by ack time.
func revisionOrder(r result, acked []ackedWrite) int {
	byCall := make([]ackedWrite, len(acked))
	copy(byCall, acked)
	sort.Slice(byCall, func(i, j int) bool { return byCall[i].Call < byCall[j].Call })
	var samples []string
	backwards := 0
	var maxRev int64
	var maxKey string
	j := 0
	for _, w := range byCall {
		for ; j < len(acked) && acked[j].Ack < w.Call; j++ {
			if acked[j].Rev > maxRev {
				maxRev, maxKey = acked[j].Rev, acked[j].Key
			}
		}
		if w.Rev <= maxRev {
			backwards++
			if len(samples) < 10 {
				samples = append(samples, fmt.Sprintf("%s got revision %d, called at %.3f s after %s was acknowledged at revision %d",
					w.Key, w.Rev, w.Call, maxKey, maxRev))
			}
		}
	}
	seen := make(map[int64]string, len(acked))
	duplicates := 0
	for _, w := range acked {
		if other, ok := seen[w.Rev]; ok {
			duplicates++
			if len(samples) < 20 {
				samples = append(samples, fmt.Sprintf("%s and %s both acknowledged at revision %d", other, w.Key, w.Rev))
			}
		}
		seen[w.Rev] = w.Key
	}
	if len(acked) > 0 {
		r["first_rev"] = acked[0].Rev
		var hi int64
		for _, w := range acked {
			hi = max(hi, w.Rev)
		}
		r["max_rev"] = hi
	}
	r["revisions_backwards"] = backwards
	r["duplicate_revisions"] = duplicates
	if samples == nil {
		samples = []string{}
	}
	r["revision_problems"] = samples
	return backwards + duplicates
}

func runVerify(args []string) (result, error) {
	c := newFlags("verify", time.Minute)
	record := c.fs.String("record", "", "the write mode's --record file")
	retry := c.fs.Duration("retry", 30*time.Second, "keep retrying the reads this long (the cluster may still be electing)")
	if err := c.parse(args); err != nil {
		return nil, err
	}
	if *record == "" {
		return nil, fmt.Errorf("%w: --record is required", errUsage)
	}
	rec, err := readRecord(*record)
	if err != nil {
		return nil, err
	}
	cli, err := c.dial()
	if err != nil {
		return nil, err
	}
	defer cli.Close()

	var found map[string][2]int64
	var rev int64
	var lastErr error
	for end := time.Now().Add(*retry); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		found, rev, lastErr = readPrefix(c, cli, rec.Prefix)
		if lastErr == nil {
			break
		}
	}
	if lastErr != nil {
		return nil, fmt.Errorf("reading %s back: %w", rec.Prefix, lastErr)
	}

	var samples []string
	note := func(format string, a ...any) {
		if len(samples) < 20 {
			samples = append(samples, fmt.Sprintf(format, a...))
		}
	}
	missing, wrongRev := 0, 0
	var maxAcked int64
	known := make(map[string]bool, len(rec.Acked)+len(rec.Unknown))
	for _, a := range rec.Acked {
		known[a.Key] = true
		maxAcked = max(maxAcked, a.Rev)
		got, ok := found[a.Key]
		switch {
		case !ok:
			missing++
			note("%s (acknowledged at revision %d) is missing", a.Key, a.Rev)
		case got[0] != a.Rev || got[1] != a.Rev:
			wrongRev++
			note("%s acknowledged at revision %d has create revision %d, mod revision %d", a.Key, a.Rev, got[1], got[0])
		}
	}
	unknownPresent := 0
	for _, k := range rec.Unknown {
		known[k] = true
		if _, ok := found[k]; ok {
			unknownPresent++
		}
	}
	phantoms := 0
	for k := range found {
		if !known[k] {
			phantoms++
			note("%s exists but was never written", k)
		}
	}
	behind := 0
	if rev < maxAcked {
		behind = 1
		note("the cluster is at revision %d, behind the highest acknowledged revision %d", rev, maxAcked)
	}
	if samples == nil {
		samples = []string{}
	}
	return result{
		"acked":           len(rec.Acked),
		"unknown":         len(rec.Unknown),
		"unknown_present": unknownPresent,
		"found":           len(found),
		"missing":         missing,
		"wrong_revision":  wrongRev,
		"phantoms":        phantoms,
		"revision":        rev,
		"max_acked_rev":   maxAcked,
		"problems":        samples,
		"violations":      missing + wrongRev + phantoms + behind,
	}, nil
}

// readPrefix reads every key under prefix at one revision, a page at a time:
// key -> [mod revision, create revision], and that revision.
func readPrefix(c *common, cli *clientv3.Client, prefix string) (map[string][2]int64, int64, error) {
	found := map[string][2]int64{}
	end := clientv3.GetPrefixRangeEnd(prefix)
	from := prefix
	var rev int64
	for {
		ctx, cancel := context.WithTimeout(context.Background(), max(c.opTimeout, 10*time.Second))
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(5000), clientv3.WithKeysOnly()}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		r, err := cli.Get(ctx, from, opts...)
		cancel()
		if err != nil {
			return nil, 0, err
		}
		if rev == 0 {
			rev = r.Header.Revision
		}
		for _, kv := range r.Kvs {
			found[string(kv.Key)] = [2]int64{kv.ModRevision, kv.CreateRevision}
		}
		if !r.More || len(r.Kvs) == 0 {
			return found, rev, nil
		}
		from = string(r.Kvs[len(r.Kvs)-1].Key) + "\x00"
	}
}
