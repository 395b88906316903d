// parse_duration prints what Go's time.ParseDuration makes of each string
// of a JSON array read on stdin: a JSON array of {"ns": n} or {"error": text},
// in order. tests/test_go_duration.py holds brain/go_duration.py to it.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"time"
)

type outcome struct {
	Ns    *int64 `json:"ns,omitempty"`
	Error string `json:"error,omitempty"`
}

func main() {
	var inputs []string
	if err := json.NewDecoder(os.Stdin).Decode(&inputs); err != nil {
		fmt.Fprintln(os.Stderr, "parse_duration: reading the inputs:", err)
		os.Exit(2)
	}
	outcomes := make([]outcome, len(inputs))
	for i, s := range inputs {
		d, err := time.ParseDuration(s)
		if err != nil {
			outcomes[i].Error = err.Error()
			continue
		}
		ns := int64(d)
		outcomes[i].Ns = &ns
	}
	if err := json.NewEncoder(os.Stdout).Encode(outcomes); err != nil {
		fmt.Fprintln(os.Stderr, "parse_duration: writing the outcomes:", err)
		os.Exit(2)
	}
}
