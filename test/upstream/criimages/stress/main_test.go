package main

import "testing"

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int{"100M": 100 << 20, "4k": 4096, "1G": 1 << 30, "512": 512} {
		if got, err := parseSize(in); err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "M", "-1M", "ten"} {
		if _, err := parseSize(in); err == nil {
			t.Errorf("parseSize(%q) succeeded", in)
		}
	}
}
