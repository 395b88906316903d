package main

import (
	"math"
	"time"
)

// hist is a latency histogram with logarithmic buckets 1% wide from 1 µs to
// about 20 minutes: bounded memory whatever the op count, percentiles within
// 1%. Exact count, sum and max are kept beside it. Not safe for concurrent
// use: each goroutine keeps its own and they are merged at the end.
type hist struct {
	counts []uint64
	n      uint64
	sumUs  float64
	maxUs  float64
}

const (
	histBuckets = 2100
	histGrowth  = 1.01
)

var lnGrowth = math.Log(histGrowth)

func newHist() *hist { return &hist{counts: make([]uint64, histBuckets)} }

func (h *hist) add(d time.Duration) { h.addUs(float64(d) / 1e3) }

func (h *hist) addUs(us float64) {
	if us < 0 {
		us = 0
	}
	b := 0
	if us >= 1 {
		b = int(math.Log(us)/lnGrowth) + 1
	}
	if b >= histBuckets {
		b = histBuckets - 1
	}
	h.counts[b]++
	h.n++
	h.sumUs += us
	if us > h.maxUs {
		h.maxUs = us
	}
}

func (h *hist) merge(o *hist) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.sumUs += o.sumUs
	h.maxUs = max(h.maxUs, o.maxUs)
}

func mergeHists(hs []*hist) *hist {
	m := newHist()
	for _, h := range hs {
		m.merge(h)
	}
	return m
}

// quantileUs is the q-quantile in µs: the geometric middle of its bucket
// (bucket b >= 1 holds [g^(b-1), g^b) µs), never above the exact max.
func (h *hist) quantileUs(q float64) float64 {
	if h.n == 0 {
		return 0
	}
	target := uint64(math.Ceil(q * float64(h.n)))
	if target < 1 {
		target = 1
	}
	var cum uint64
	for b, c := range h.counts {
		cum += c
		if cum >= target {
			if b == 0 {
				return min(0.5, h.maxUs)
			}
			return min(math.Pow(histGrowth, float64(b)-0.5), h.maxUs)
		}
	}
	return h.maxUs
}

func round3(x float64) float64 { return math.Round(x*1000) / 1000 }

// summary is the latency_ms object: p50, p90, p99, max, mean in ms.
func (h *hist) summary() map[string]float64 {
	mean := 0.0
	if h.n > 0 {
		mean = h.sumUs / float64(h.n)
	}
	return map[string]float64{
		"p50":  round3(h.quantileUs(0.50) / 1e3),
		"p90":  round3(h.quantileUs(0.90) / 1e3),
		"p99":  round3(h.quantileUs(0.99) / 1e3),
		"max":  round3(h.maxUs / 1e3),
		"mean": round3(mean / 1e3),
	}
}

// tail is summary plus p999: the node-capacity step judges tails and shows
// how far past p99 they reach.
func (h *hist) tail() map[string]float64 {
	s := h.summary()
	s["p999"] = round3(h.quantileUs(0.999) / 1e3)
	return s
}
