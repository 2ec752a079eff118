// Command stress is the memory part of the stress tool that upstream's ResourceConsumer test image
// carries, as containerd's TestContainerConsumedStats runs it: `stress -m 1 --vm-bytes 100M
// --vm-hang 0 -t 30` allocates 100 MiB in each of -m workers, touches every page so that it counts
// in the container's working set, and holds it until the timeout (--vm-hang 0: without freeing it).
package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

func main() {
	workers := flag.Int("m", 1, "workers, each holding --vm-bytes")
	size := flag.String("vm-bytes", "256M", "bytes each worker holds (suffixes K, M, G)")
	hang := flag.Int("vm-hang", 0, "seconds to hold the memory before freeing it (0: until the timeout)")
	timeout := flag.Int("t", 0, "seconds to run (0: forever)")
	flag.Parse()
	bytes, err := parseSize(*size)
	if err != nil {
		fmt.Fprintln(os.Stderr, "stress:", err)
		os.Exit(2)
	}
	if *hang != 0 {
		fmt.Fprintln(os.Stderr, "stress: only --vm-hang 0 (hold the memory) is supported")
		os.Exit(2)
	}
	held := make([][]byte, *workers)
	for i := range held {
		held[i] = make([]byte, bytes)
		for page := 0; page < len(held[i]); page += 4096 {
			held[i][page] = 1
		}
	}
	fmt.Printf("stress: holding %d x %d bytes\n", *workers, bytes)
	if *timeout == 0 {
		select {}
	}
	time.Sleep(time.Duration(*timeout) * time.Second)
	fmt.Printf("stress: held %d bytes for %d s\n", len(held)*bytes, *timeout)
}

// parseSize reads a byte count with an optional K, M or G suffix (powers of 1024).
func parseSize(value string) (int, error) {
	s, multiplier := value, 1
	switch {
	case strings.HasSuffix(s, "K"), strings.HasSuffix(s, "k"):
		multiplier = 1 << 10
	case strings.HasSuffix(s, "M"), strings.HasSuffix(s, "m"):
		multiplier = 1 << 20
	case strings.HasSuffix(s, "G"), strings.HasSuffix(s, "g"):
		multiplier = 1 << 30
	}
	if multiplier > 1 {
		s = s[:len(s)-1]
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("--vm-bytes %q: want a positive byte count, optionally with K, M or G", value)
	}
	return n * multiplier, nil
}
