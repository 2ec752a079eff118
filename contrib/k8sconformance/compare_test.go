package main

import (
	"regexp"
	"slices"
	"testing"
)

func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		name            string
		knext, upstream []string
		want            verdict
	}{
		{"both pass", []string{passed}, []string{passed}, same},
		{"both fail", []string{failed}, []string{failed}, same},
		{"both skip", []string{skipped}, []string{skipped}, same},
		{"knext fails every run", []string{failed, failed, failed, failed}, []string{passed, passed, passed, passed}, regression},
		{"knext skips what upstream runs", []string{skipped, skipped, skipped, skipped}, []string{passed, passed, passed, passed}, regression},
		{"knext fails, then skips", []string{failed, skipped, failed, failed}, []string{passed, passed, passed, passed}, regression},
		{"upstream fails every run", []string{passed, passed, passed, passed}, []string{failed, failed, failed, failed}, fixed},
		{"knext passes on a rerun", []string{failed, passed, failed, failed}, []string{passed, passed, passed, passed}, flaky},
		{"upstream fails on a rerun", []string{failed, failed, failed, failed}, []string{passed, failed, passed, passed}, flaky},
		{"upstream passes on a rerun", []string{passed, passed, passed, passed}, []string{failed, passed, failed, failed}, flaky},
		{"failed against skipped", []string{failed, failed}, []string{skipped, skipped}, flaky},
		{"ran on knext only", []string{passed}, nil, flaky},
	} {
		if got := classify(tc.knext, tc.upstream); got != tc.want {
			t.Errorf("%s: classify(%q, %q) = %s, want %s", tc.name, tc.knext, tc.upstream, got, tc.want)
		}
	}
}

func TestDifferingAndExactFocus(t *testing.T) {
	knext := map[string]outcome{
		"[sig-network] DNS should provide DNS for services  [Conformance]":                                                  {State: passed},
		"[sig-network] Services should serve a basic endpoint from pods  [Conformance]":                                     {State: failed},
		"[sig-network] HostPort validates that there is no conflict [Conformance]":                                          {State: skipped},
		"[sig-network] Proxy version v1 A set of valid responses are returned for both pod and service Proxy [Conformance]": {State: passed},
	}
	upstream := map[string]outcome{
		"[sig-network] DNS should provide DNS for services  [Conformance]":                                                  {State: passed},
		"[sig-network] Services should serve a basic endpoint from pods  [Conformance]":                                     {State: passed},
		"[sig-network] HostPort validates that there is no conflict [Conformance]":                                          {State: passed},
		"[sig-network] Proxy version v1 A set of valid responses are returned for both pod and service Proxy [Conformance]": {State: passed},
		"[sig-network] Service endpoints latency should not be very high  [Conformance]":                                    {State: passed},
	}
	names := differing(knext, upstream)
	want := []string{
		"[sig-network] HostPort validates that there is no conflict [Conformance]",
		"[sig-network] Service endpoints latency should not be very high  [Conformance]",
		"[sig-network] Services should serve a basic endpoint from pods  [Conformance]",
	}
	if !slices.Equal(names, want) {
		t.Fatalf("differing = %q, want %q", names, want)
	}
	// The rerun's focus selects exactly these specs: brackets and dots are literal, and a name
	// that only starts like one of them does not match.
	focus := regexp.MustCompile(exactFocus(names))
	for name := range upstream {
		if got, want := focus.MatchString(name), slices.Contains(names, name); got != want {
			t.Errorf("exact focus matches %q: %v, want %v", name, got, want)
		}
	}
	if focus.MatchString("[sig-network] HostPort validates that there is no conflict [Conformance] and more") {
		t.Error("exact focus matches a longer name")
	}
}
