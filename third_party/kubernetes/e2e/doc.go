// Package e2e is Kubernetes' end-to-end suite (k8s.io/kubernetes/test/e2e) with the sig-network
// specs compiled in (test/e2e/network, which brings its network policy specs, and the common
// specs test/e2e imports, test/e2e/common/network among them). build.sh builds it with
// `go test -c` into e2e.test, as kubernetes' own test/e2e/e2e_test.go builds the whole suite: the
// same flags (--kubeconfig, --ginkgo.focus, --report-dir, --list-images, --list-tests, ...).
package e2e
