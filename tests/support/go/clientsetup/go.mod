// clientsetup: what the etcd v3 clients of brain's tools make of their
// --endpoints and --verbose flags, written once for brainload
// (benchmarks/go/brainload) and clustercheck (tests/cluster/go), which take it
// with a replace directive. Nothing here is imported by brain.
module brain.tests/clientsetup

go 1.26.0

require go.uber.org/zap v1.27.0

require go.uber.org/multierr v1.11.0 // indirect
