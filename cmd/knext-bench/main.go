// Command knext-bench measures what knext costs against upstream containerd (`make bench`,
// docs/performance.md); the command is package bench.
package main

import "github.com/knext-dev/knext/internal/bench"

func main() { bench.Main() }
