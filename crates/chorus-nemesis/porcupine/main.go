// Command chorus-porcupine checks the block reads and writes of a chorus-nemesis run for
// linearizability with porcupine (github.com/anishathalye/porcupine), one register per
// block.
//
// Usage:
//
//	chorus-porcupine -in blocks.json -html DIR
//
// The input is what crates/chorus-nemesis/src/porcupine.rs writes: for each block, its
// operations, each a write of a value or a read that returned one (0: never written),
// with its client, invocation and return times in microseconds. A write whose outcome is
// unknown returns after everything else. The output, on stdout, is one JSON object per
// block: {"block": N, "result": "Ok" | "Illegal" | "Unknown", "html": PATH}, where PATH
// (for an illegal history only) is porcupine's visualisation of the longest
// linearizable prefix, and "Unknown" means the check ran out of time.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/anishathalye/porcupine"
)

type op struct {
	Client int    `json:"client"`
	Write  bool   `json:"write"`
	Value  uint64 `json:"value"`
	Call   int64  `json:"call"`
	Return int64  `json:"ret"`
}

type block struct {
	Block uint64 `json:"block"`
	Ops   []op   `json:"ops"`
}

type input struct {
	TimeoutSecs int     `json:"timeout_secs"`
	Blocks      []block `json:"blocks"`
}

type result struct {
	Block  uint64 `json:"block"`
	Result string `json:"result"`
	HTML   string `json:"html,omitempty"`
	Ops    int    `json:"ops"`
}

type in struct {
	write bool
	value uint64
}

// The model of one block: a register that starts at zero. A write sets it; a read must
// return what it holds.
var register = porcupine.Model{
	Init: func() interface{} { return uint64(0) },
	Step: func(state, input, output interface{}) (bool, interface{}) {
		i := input.(in)
		if i.write {
			return true, i.value
		}
		return output.(uint64) == state.(uint64), state
	},
	Equal: func(a, b interface{}) bool { return a.(uint64) == b.(uint64) },
	DescribeOperation: func(input, output interface{}) string {
		i := input.(in)
		if i.write {
			return fmt.Sprintf("write(%#x)", i.value)
		}
		return fmt.Sprintf("read() -> %#x", output.(uint64))
	},
	DescribeState: func(state interface{}) string { return fmt.Sprintf("%#x", state.(uint64)) },
}

func main() {
	inPath := flag.String("in", "", "the operations, as JSON")
	htmlDir := flag.String("html", ".", "where visualisations of illegal histories go")
	flag.Parse()
	raw, err := os.ReadFile(*inPath)
	if err != nil {
		fmt.Fprintf(os.Stderr, "chorus-porcupine: %v\n", err)
		os.Exit(2)
	}
	var h input
	if err := json.Unmarshal(raw, &h); err != nil {
		fmt.Fprintf(os.Stderr, "chorus-porcupine: %s: %v\n", *inPath, err)
		os.Exit(2)
	}
	timeout := time.Duration(h.TimeoutSecs) * time.Second
	enc := json.NewEncoder(os.Stdout)
	for _, b := range h.Blocks {
		ops := make([]porcupine.Operation, 0, len(b.Ops))
		for _, o := range b.Ops {
			ops = append(ops, porcupine.Operation{
				ClientId: o.Client,
				Input:    in{write: o.Write, value: o.Value},
				Call:     o.Call,
				Output:   o.Value,
				Return:   o.Return,
			})
		}
		res, info := porcupine.CheckOperationsVerbose(register, ops, timeout)
		r := result{Block: b.Block, Result: string(res), Ops: len(ops)}
		if res == porcupine.Illegal {
			r.HTML = filepath.Join(*htmlDir, fmt.Sprintf("porcupine-block-%d.html", b.Block))
			if err := porcupine.VisualizePath(register, info, r.HTML); err != nil {
				fmt.Fprintf(os.Stderr, "chorus-porcupine: visualising block %d: %v\n", b.Block, err)
				r.HTML = ""
			}
		}
		if err := enc.Encode(r); err != nil {
			fmt.Fprintf(os.Stderr, "chorus-porcupine: %v\n", err)
			os.Exit(2)
		}
	}
}
