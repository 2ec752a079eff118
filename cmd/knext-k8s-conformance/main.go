// Command knext-k8s-conformance runs Kubernetes' end-to-end suite on knext and on upstream
// containerd (`make k8s-conformance`, docs/conformance.md); the command is package k8sconformance.
package main

import "github.com/knext-dev/knext/internal/k8sconformance"

func main() { k8sconformance.Main() }
