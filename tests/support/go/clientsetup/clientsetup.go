// Package clientsetup is what the etcd v3 clients of brain's tools
// (brainload, clustercheck) make of the flags they share: the --endpoints
// list and the client's logger under --verbose.
package clientsetup

import (
	"strings"

	"go.uber.org/zap"
)

// Endpoints is a comma list of endpoints as a slice, blanks dropped.
func Endpoints(list string) []string {
	var eps []string
	for _, e := range strings.Split(list, ",") {
		if e = strings.TrimSpace(e); e != "" {
			eps = append(eps, e)
		}
	}
	return eps
}

// Logger is the etcd client's logger: zap's development logger (warnings on
// stderr) when verbose, else none.
func Logger(verbose bool) *zap.Logger {
	if !verbose {
		return zap.NewNop()
	}
	l, err := zap.NewDevelopment()
	if err != nil {
		return zap.NewNop()
	}
	return l
}
