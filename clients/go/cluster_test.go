package chorus_test

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A local cluster started by `chorus dev --detach`: real server processes on loopback.
type cluster struct {
	dir       string
	endpoints []string
	pids      []int // node i's pid is pids[i-1]
}

// chorusBin is the server binary: $CHORUS_BIN, or ../../target/debug/chorus. Without
// it the cluster tests skip, or fail when CHORUS_REQUIRE_CLUSTER=1 (CI).
func chorusBin(t *testing.T) string {
	t.Helper()
	bin := os.Getenv("CHORUS_BIN")
	if bin == "" {
		bin = filepath.Join("..", "..", "target", "debug", "chorus")
	}
	abs, err := filepath.Abs(bin)
	if err == nil {
		var st os.FileInfo
		if st, err = os.Stat(abs); err == nil && (st.IsDir() || st.Mode()&0o111 == 0) {
			err = fmt.Errorf("%s is not an executable file", abs)
		}
	}
	if err != nil {
		msg := fmt.Sprintf("no chorus server binary (%v): build it with `cargo build -p chorus-server --bin chorus` in the repository root, or set CHORUS_BIN", err)
		if os.Getenv("CHORUS_REQUIRE_CLUSTER") == "1" {
			t.Fatal(msg + " (CHORUS_REQUIRE_CLUSTER=1: not skipping)")
		}
		t.Skip(msg)
	}
	return abs
}

// portsFree reports whether every port `chorus dev --nodes n --base-port base` uses is
// free on loopback.
func portsFree(base, nodes int) bool {
	for _, off := range []int{0, 100, 200} {
		for i := 1; i <= nodes; i++ {
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", base+off+i))
			if err != nil {
				return false
			}
			l.Close()
		}
	}
	return true
}

func freeBase(t *testing.T, nodes int) int {
	for range 200 {
		base := 40000 + rand.IntN(19700)
		if portsFree(base, nodes) {
			return base
		}
	}
	t.Fatal("no free base port in 40000-60000")
	return 0
}

var ansi = regexp.MustCompile("\x1b\\[[0-9;]*m")

var apiLine = regexp.MustCompile(`(?m)^\s*node (\d+)\s+api (\S+)`)

// startCluster starts a 3-node cluster in a temporary directory (extra: more `chorus
// dev` flags, e.g. --tls) and stops it when the test ends.
func startCluster(t *testing.T, extra ...string) *cluster {
	t.Helper()
	bin := chorusBin(t)
	dir := t.TempDir()
	cl := &cluster{dir: dir}
	// Registered after TempDir's own cleanup, so it runs before the directory goes.
	t.Cleanup(func() { cl.stop(t) })
	var lastErr string
	for attempt := 1; attempt <= 3; attempt++ {
		base := freeBase(t, 3)
		args := append([]string{"dev", "--detach", "--fresh", "--dir", dir, "--base-port", strconv.Itoa(base)}, extra...)
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
		cancel()
		cl.readPids(t)
		if err != nil {
			// A port taken between the check and the start, or a slow election: the
			// nodes it left (if any) are stopped before the next try.
			lastErr = fmt.Sprintf("chorus %s: %v\n%s", strings.Join(args, " "), err, out)
			t.Logf("attempt %d: %s", attempt, lastErr)
			cl.stop(t)
			continue
		}
		for _, m := range apiLine.FindAllStringSubmatch(string(out), -1) {
			cl.endpoints = append(cl.endpoints, m[2])
		}
		if len(cl.endpoints) != 3 || len(cl.pids) != 3 {
			t.Fatalf("could not read the endpoints (%v) and pids (%v) of `chorus dev`:\n%s", cl.endpoints, cl.pids, out)
		}
		return cl
	}
	t.Fatalf("could not start a cluster: %s", lastErr)
	return nil
}

func (cl *cluster) readPids(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(cl.dir, "pids"))
	if err != nil {
		return
	}
	cl.pids = nil
	for _, f := range strings.Fields(string(b)) {
		if p, err := strconv.Atoi(f); err == nil {
			cl.pids = append(cl.pids, p)
		}
	}
}

// alive reports whether pid runs (a zombie does not).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] != 'Z'
	}
	return true
}

// stop kills the cluster's nodes (SIGTERM, then SIGKILL after 5 s) and, if the test
// failed, shows the end of each node's log.
func (cl *cluster) stop(t *testing.T) {
	if t.Failed() && len(cl.pids) > 0 {
		for i := range cl.pids {
			log := filepath.Join(cl.dir, fmt.Sprintf("n%d.log", i+1))
			t.Logf("last lines of %s:\n%s", log, ansi.ReplaceAllString(tail(log, 25), ""))
		}
	}
	for _, p := range cl.pids {
		_ = syscall.Kill(p, syscall.SIGCONT) // in case a test stopped it
		_ = syscall.Kill(p, syscall.SIGTERM)
	}
	deadline := time.Now().Add(5 * time.Second)
	for _, p := range cl.pids {
		for alive(p) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if alive(p) {
			_ = syscall.Kill(p, syscall.SIGKILL)
		}
	}
	cl.pids = nil
}

func tail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if len(lines) > n {
			lines = lines[1:]
		}
	}
	return strings.Join(lines, "\n")
}

// pidOf is node n's process id.
func (cl *cluster) pidOf(t *testing.T, node uint64) int {
	t.Helper()
	if node < 1 || int(node) > len(cl.pids) {
		t.Fatalf("no pid for node %d (pids %v)", node, cl.pids)
	}
	return cl.pids[node-1]
}
