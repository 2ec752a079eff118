// Command coredns is CoreDNS, pinned in go.mod, with the plugins a cluster's DNS needs: those of
// the Corefile that Kubernetes' own deployments of CoreDNS use. CoreDNS's own main compiles in
// every plugin (cloud providers' SDKs included); a main that imports only some is how CoreDNS
// documents building a smaller one. The directives' order is CoreDNS's, whatever this imports.
package main

import (
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"

	"github.com/coredns/coredns/coremain"
)

func main() {
	coremain.Run()
}
