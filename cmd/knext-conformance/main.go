// Command knext-conformance runs critest against upstream containerd and knext, side by side (`make
// conformance`, docs/conformance.md); the command is package conformance.
package main

import "github.com/knext-dev/knext/internal/conformance"

func main() { conformance.Main() }
