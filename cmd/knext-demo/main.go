// Command knext-demo runs two pods on a knext containerd without CNI, networked by nri-bridge
// (`make demo`); the command is package demo.
package main

import "github.com/knext-dev/knext/internal/demo"

func main() { demo.Main() }
