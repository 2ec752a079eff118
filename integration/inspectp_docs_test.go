package integration

import (
	"context"
	"encoding/json"
	"maps"
	"slices"
	"testing"

	"github.com/knext-dev/knext/internal/stack"
	"github.com/knext-dev/knext/test/doccheck"
)

// repositoryRoot is this checkout, from this package's directory.
const repositoryRoot = ".."

// crictlInspectpValue returns what `crictl inspectp -o json` prints for pod id, decoded.
func crictlInspectpValue(t *testing.T, ctx context.Context, h *stack.Stack, id string) map[string]any {
	t.Helper()
	out := crictlInspectpOutput(t, ctx, h, id)
	var value map[string]any
	if err := json.Unmarshal(out, &value); err != nil {
		t.Fatalf("crictl inspectp %s: %v\n%s", id, err, out)
	}
	return value
}

// setOf returns the sorted union of lists.
func setOf(lists ...[]string) []string {
	set := map[string]bool{}
	for _, list := range lists {
		for _, s := range list {
			set[s] = true
		}
	}
	return slices.Sorted(maps.Keys(set))
}

// withoutAll returns the elements of list that are not in other.
func withoutAll(list, other []string) []string {
	var rest []string
	for _, s := range list {
		if !slices.Contains(other, s) {
			rest = append(rest, s)
		}
	}
	return rest
}

// The examples of `crictl inspectp` output in the pages (docs/inspectp.md, docs/configuration.md,
// each marked <!-- inspectp:ID -->) have the shape of the real output. crictl inspectp of one pod
// whose IPs come from CNI, from a plugin's RunPodSandbox answer and from a status plugin, first
// live and then, once the plugin fails, last known, shows together exactly the podNetwork fields
// and the provenance values the examples show together; and every other field an example shows
// (under status and info) is a field of the real output.
func TestInspectpAsDocumented(t *testing.T) {
	t.Parallel()
	repository, err := doccheck.OpenRepository(repositoryRoot)
	if err != nil {
		t.Fatal(err)
	}
	examples, err := repository.InspectpExamples()
	if err != nil {
		t.Fatal(err)
	}
	if len(examples) == 0 {
		t.Fatalf("no page of %s has an example of crictl inspectp output marked <!-- %s:ID -->", repositoryRoot, doccheck.InspectpRegionKind)
	}

	h, ctx := startHarness(t, stack.Options{})
	reporter := startRunReporter(t, ctx, h, "10", "reporter")
	status := startTestPlugin(t, ctx, h, "20", "annot")
	id := runPod(t, ctx, h, annotatedPodConfig(h, "documented", map[string]string{
		runIPsAnnotation(reporter.name):                 "10.99.0.7",
		pluginAnnotation(status.name, "additional-ips"): "fd00::5",
	}))
	shown := []map[string]any{crictlInspectpValue(t, ctx, h, id)}
	status.behave(t, "", behaveError)
	shown = append(shown, crictlInspectpValue(t, ctx, h, id))

	var realFields, realNetworkFields, realProvenance []string
	for _, value := range shown {
		realFields = setOf(realFields, doccheck.FieldPaths(value))
		realNetworkFields = setOf(realNetworkFields, doccheck.FieldPaths(value[doccheck.PodNetworkKey]))
		realProvenance = setOf(realProvenance, doccheck.Provenance(value[doccheck.PodNetworkKey]))
	}
	// The cases this test sets up: if one is missing, the comparison below says nothing of it.
	if want := []string{"nri last-known", "nri live", "nri run-pod-sandbox", "source cni", "source nri:"}; !slices.Equal(realProvenance, want) {
		t.Fatalf("crictl inspectp of pod %s shows the provenance %v, want %v:\n%v", id, realProvenance, want, shown)
	}
	if !slices.Contains(realNetworkFields, "nriNoAnswer[].error") {
		t.Fatalf("crictl inspectp of pod %s shows no plugin that gave no answer once its status plugin fails:\n%v", id, shown[1])
	}

	var docNetworkFields, docProvenance []string
	for _, e := range examples {
		docNetworkFields = setOf(docNetworkFields, doccheck.FieldPaths(e.PodNetwork()))
		docProvenance = setOf(docProvenance, doccheck.Provenance(e.PodNetwork()))
		if invented := withoutAll(doccheck.FieldPaths(e.Value), realFields); len(invented) > 0 {
			t.Errorf("%s: the example shows fields crictl inspectp does not: %v", e.Where, invented)
		}
	}
	if missing := withoutAll(realNetworkFields, docNetworkFields); len(missing) > 0 {
		t.Errorf("crictl inspectp shows fields of %s that no example shows: %v", doccheck.PodNetworkKey, missing)
	}
	if missing := withoutAll(realProvenance, docProvenance); len(missing) > 0 {
		t.Errorf("crictl inspectp shows provenance values that no example shows: %v", missing)
	}
	if invented := withoutAll(docProvenance, realProvenance); len(invented) > 0 {
		t.Errorf("the examples show provenance values that crictl inspectp does not: %v", invented)
	}
}
