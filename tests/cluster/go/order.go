package main

import (
	"fmt"
	"sort"
	"sync"
)

// Real-time order of header revisions, checked over every operation a mode
// records, whatever its kind or key: an operation called after another one
// returned (on any client) must not report a lower header revision. The
// revision is the cluster's clock, so a lower one means the answer came from
// state that had not caught up with a revision the cluster had already
// returned: a stale read when the key it read had changed in between, and a
// stale answer even when it had not (porcupine checks values per key; this
// check sees the staleness on keys nobody wrote meanwhile too).
//
// Equal revisions are fine (reads at the same revision, a failed compare
// between two writes); only operations whose outcome the client knows are
// recorded.

// revOp is one answered operation: what it was, who asked, when it was
// called and returned (seconds since processStart) and its header revision.
type revOp struct {
	What   string
	Client int
	Call   float64
	Ret    float64
	Rev    int64
}

// revLog collects revOps from many goroutines.
type revLog struct {
	mu  sync.Mutex
	ops []revOp
}

func (l *revLog) add(op revOp) {
	l.mu.Lock()
	l.ops = append(l.ops, op)
	l.mu.Unlock()
}

// maxOrderSamples bounds the problems listed in a result.
const maxOrderSamples = 10

// headerOrder returns how many operations report a header revision below
// the highest one returned before they were called, and the first few as
// sentences naming both operations.
func headerOrder(ops []revOp) (int, []string) {
	byRet := make([]revOp, len(ops))
	copy(byRet, ops)
	sort.SliceStable(byRet, func(i, j int) bool { return byRet[i].Ret < byRet[j].Ret })
	byCall := make([]revOp, len(ops))
	copy(byCall, ops)
	sort.SliceStable(byCall, func(i, j int) bool { return byCall[i].Call < byCall[j].Call })
	n := 0
	samples := []string{}
	var best revOp // the highest revision among the operations returned so far
	seen := false
	j := 0
	for _, op := range byCall {
		for ; j < len(byRet) && byRet[j].Ret < op.Call; j++ {
			if !seen || byRet[j].Rev > best.Rev {
				best, seen = byRet[j], true
			}
		}
		if seen && op.Rev < best.Rev {
			n++
			if len(samples) < maxOrderSamples {
				samples = append(samples, fmt.Sprintf(
					"%s (client %d, called at %.6f s) reported revision %d after %s (client %d) had returned revision %d at %.6f s",
					op.What, op.Client, op.Call, op.Rev, best.What, best.Client, best.Rev, best.Ret))
			}
		}
	}
	return n, samples
}

// orderInto runs headerOrder on ops, records it in r and returns the count.
func orderInto(r result, ops []revOp) int {
	n, samples := headerOrder(ops)
	r["header_order_checked"] = len(ops)
	r["header_order_violations"] = n
	r["header_order_problems"] = samples
	return n
}
