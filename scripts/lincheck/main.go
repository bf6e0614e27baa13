// lincheck checks a history of page reads and writes recorded against a Tundra cluster for
// linearizability with Porcupine: each page is a register (it reads as the value of the last
// write that took effect, 0 before any), checked page by page.
//
// Input (standard input or the file named by the first argument): one JSON object a line,
// {"client":N,"kind":"w"|"r","page":P,"value":V,"call":NS,"ret":NS}; "ret" is -1 for a write
// whose outcome the client never learned (it may have taken effect at any time after its call).
// Output: one JSON object with the counts and the verdict; exit status 0 when linearizable,
// 2 when not, 3 when the checker ran out of time.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"time"

	"github.com/anishathalye/porcupine"
)

type record struct {
	Client int    `json:"client"`
	Kind   string `json:"kind"`
	Page   uint64 `json:"page"`
	Value  uint64 `json:"value"`
	Call   int64  `json:"call"`
	Ret    int64  `json:"ret"`
}

type input struct {
	write bool
	page  uint64
	value uint64
}

var model = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byPage := map[uint64][]porcupine.Operation{}
		var order []uint64
		for _, op := range history {
			page := op.Input.(input).page
			if _, seen := byPage[page]; !seen {
				order = append(order, page)
			}
			byPage[page] = append(byPage[page], op)
		}
		var out [][]porcupine.Operation
		for _, page := range order {
			out = append(out, byPage[page])
		}
		return out
	},
	Init: func() interface{} { return uint64(0) },
	Step: func(state, in, out interface{}) (bool, interface{}) {
		i := in.(input)
		if i.write {
			return true, i.value
		}
		return out.(uint64) == state.(uint64), state
	},
	Equal: func(a, b interface{}) bool { return a.(uint64) == b.(uint64) },
	DescribeOperation: func(in, out interface{}) string {
		i := in.(input)
		if i.write {
			return fmt.Sprintf("write(page %d, %d)", i.page, i.value)
		}
		return fmt.Sprintf("read(page %d) -> %d", i.page, out.(uint64))
	},
}

func main() {
	var reader io.Reader = os.Stdin
	if len(os.Args) > 1 {
		file, err := os.Open(os.Args[1])
		if err != nil {
			fmt.Fprintln(os.Stderr, "lincheck:", err)
			os.Exit(1)
		}
		defer file.Close()
		reader = file
	}
	var ops []porcupine.Operation
	reads, writes, unknown := 0, 0, 0
	scanner := bufio.NewScanner(reader)
	scanner.Buffer(make([]byte, 1<<20), 1<<20)
	for scanner.Scan() {
		var r record
		if err := json.Unmarshal(scanner.Bytes(), &r); err != nil {
			fmt.Fprintln(os.Stderr, "lincheck: a line that is not a record:", err)
			os.Exit(1)
		}
		ret := r.Ret
		if ret < 0 {
			ret = math.MaxInt64
			unknown++
		}
		if r.Kind == "w" {
			writes++
			ops = append(ops, porcupine.Operation{ClientId: r.Client, Input: input{true, r.Page, r.Value}, Call: r.Call, Output: uint64(0), Return: ret})
		} else {
			reads++
			ops = append(ops, porcupine.Operation{ClientId: r.Client, Input: input{false, r.Page, 0}, Call: r.Call, Output: r.Value, Return: ret})
		}
	}
	if err := scanner.Err(); err != nil {
		fmt.Fprintln(os.Stderr, "lincheck:", err)
		os.Exit(1)
	}
	result := porcupine.CheckOperationsTimeout(model, ops, 5*time.Minute)
	verdict := map[porcupine.CheckResult]string{porcupine.Ok: "linearizable", porcupine.Illegal: "not linearizable", porcupine.Unknown: "timed out"}[result]
	violations := 0
	if result == porcupine.Illegal {
		violations = 1
	}
	out, _ := json.Marshal(map[string]interface{}{
		"operations": len(ops), "reads": reads, "writes": writes, "unknown_outcome_writes": unknown,
		"verdict": verdict, "violations": violations,
	})
	fmt.Println(string(out))
	switch result {
	case porcupine.Illegal:
		os.Exit(2)
	case porcupine.Unknown:
		os.Exit(3)
	}
}
