package main

// OS accounting of the cluster over the measured interval, the same quantities Chorus's
// `chorus bench` reports (see /docs/benchmarks/result-fields.md): per process the bytes it
// caused to be written to storage (/proc/<pid>/io write_bytes) and its CPU time
// (/proc/<pid>/stat utime+stime), and for the data disk the write requests, sectors written
// and flushes the block device completed (/proc/diskstats).

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clkTck is USER_HZ, the unit of utime/stime in /proc/<pid>/stat: 100 on Linux x86_64 and
// arm64 (the kernel ABI fixes it; Go's standard library has no sysconf).
const clkTck = 100.0

type procCounters struct{ writeBytes, cpuTicks uint64 }

type devCounters struct {
	writes, sectors uint64
	flushes         uint64
	hasFlushes      bool
}

type sample struct {
	at    time.Time
	procs []procCounters
	dev   devCounters
}

type sampler struct {
	pids         []int
	major, minor uint64
}

func newSampler(pids []int, dataDir string) (*sampler, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(dataDir, &st); err != nil {
		return nil, fmt.Errorf("stat %s: %w", dataDir, err)
	}
	dev := uint64(st.Dev)
	s := &sampler{
		pids:  pids,
		major: (dev>>8)&0xfff | (dev>>32)&^uint64(0xfff),
		minor: dev&0xff | (dev>>12)&^uint64(0xff),
	}
	if _, err := s.sample(); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *sampler) sample() (sample, error) {
	out := sample{at: time.Now()}
	for _, pid := range s.pids {
		c, err := readProc(pid)
		if err != nil {
			return out, err
		}
		out.procs = append(out.procs, c)
	}
	b, err := os.ReadFile("/proc/diskstats")
	if err != nil {
		return out, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 14 || f[0] != strconv.FormatUint(s.major, 10) || f[1] != strconv.FormatUint(s.minor, 10) {
			continue
		}
		num := func(i int) uint64 { v, _ := strconv.ParseUint(f[i], 10, 64); return v }
		out.dev = devCounters{writes: num(7), sectors: num(9)}
		if len(f) >= 20 {
			out.dev.flushes, out.dev.hasFlushes = num(18), true
		}
		return out, nil
	}
	return out, fmt.Errorf("no /proc/diskstats line for device %d:%d", s.major, s.minor)
}

func readProc(pid int) (procCounters, error) {
	var c procCounters
	io, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return c, err
	}
	found := false
	for _, l := range strings.Split(string(io), "\n") {
		if v, ok := strings.CutPrefix(l, "write_bytes:"); ok {
			c.writeBytes, err = strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			found = err == nil
		}
	}
	if !found {
		return c, fmt.Errorf("/proc/%d/io: no write_bytes", pid)
	}
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return c, err
	}
	// Field 2 is "(comm)" and may hold spaces and ')': count fields after the last ')'.
	s := string(st)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return c, fmt.Errorf("/proc/%d/stat: no ')'", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return c, fmt.Errorf("/proc/%d/stat: too few fields", pid)
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	stt, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return c, fmt.Errorf("/proc/%d/stat: bad utime/stime", pid)
	}
	c.cpuTicks = ut + stt
	return c, nil
}

// fill sets the result's OS fields from two samples; appends and size give the payload.
func (r *result) fill(a, b sample, appends int64, size int) {
	secs := b.at.Sub(a.at).Seconds()
	var writes []uint64
	var sum, cpu uint64
	for i := range a.procs {
		w := b.procs[i].writeBytes - a.procs[i].writeBytes
		writes = append(writes, w)
		sum += w
		cpu += b.procs[i].cpuTicks - a.procs[i].cpuTicks
	}
	r.ProcWriteBytes = writes
	payload := float64(appends) * float64(size)
	cpuSec := float64(cpu) / clkTck
	r.CPUSeconds = &cpuSec
	if appends > 0 {
		wa := float64(sum) / float64(len(writes)) / payload
		r.WriteAmp = &wa
		per := cpuSec / float64(appends) * 1e6
		r.CPUSecPerMillion = &per
	}
	devBytes := (b.dev.sectors - a.dev.sectors) * 512
	r.DevWriteBytes = &devBytes
	reqs := float64(b.dev.writes-a.dev.writes) / secs
	r.DevWriteReqsPerSec = &reqs
	mb := float64(devBytes) / secs / 1e6
	r.DevWriteMBPerSec = &mb
	if a.dev.hasFlushes && b.dev.hasFlushes {
		fl := float64(b.dev.flushes-a.dev.flushes) / secs
		r.DevFlushesPerSec = &fl
	}
}
