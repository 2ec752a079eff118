// Package integration holds knext's end-to-end tests: real containerd, shims, runc, CNI and
// crictl, each test on its own harness instance (see package stack). They need root, `make
// build` and `make images`; two `go test` runs of this package may run at the same time.
package integration
