package main

import (
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// latHist records latencies in microseconds, 1 us .. 60 s, 3 significant digits.
type latHist struct{ h *hdrhistogram.Histogram }

func newLatHist() *latHist { return &latHist{hdrhistogram.New(1, 60_000_000, 3)} }

func (l *latHist) record(d time.Duration) {
	us := d.Microseconds()
	if us < 1 {
		us = 1
	}
	_ = l.h.RecordValue(us)
}

func (l *latHist) merge(o *latHist)           { l.h.Merge(o.h) }
func (l *latHist) count() int64               { return l.h.TotalCount() }
func (l *latHist) quantileUs(q float64) int64 { return l.h.ValueAtQuantile(q) }
func (l *latHist) maxUs() int64               { return l.h.Max() }
