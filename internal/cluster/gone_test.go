package cluster

import (
	"context"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	criruntime "k8s.io/cri-api/pkg/apis/runtime/v1"
)

func TestGoneSandboxes(t *testing.T) {
	sandbox := func(id, name, uid string, state criruntime.PodSandboxState) *criruntime.PodSandbox {
		return &criruntime.PodSandbox{Id: id, State: state, Metadata: &criruntime.PodSandboxMetadata{Name: name, Uid: uid}}
	}
	ready, notReady := criruntime.PodSandboxState_SANDBOX_READY, criruntime.PodSandboxState_SANDBOX_NOTREADY
	stopped, stopping := goneSandboxes([]*criruntime.PodSandbox{
		sandbox("s1", "live", "u1", ready),            // its pod is in the API: left alone
		sandbox("s2", "deleted", "u2", ready),         // its pod is gone: the kubelet has yet to stop it
		sandbox("s3", "stopped-live", "u1", notReady), // stopped: removed, whether its pod is there or not
		sandbox("s4", "stopped-gone", "u3", notReady), //
		sandbox("s5", "not-the-kubelets", "", ready),  // no pod UID: never waited for
	}, map[string]bool{"u1": true})
	if !slices.Equal(stopped, []string{"s3", "s4"}) || !slices.Equal(stopping, []string{"deleted"}) {
		t.Errorf("stopped %v, stopping %v; want [s3 s4], [deleted]", stopped, stopping)
	}
}

func TestNodesReady(t *testing.T) {
	node := func(name string, ready corev1.ConditionStatus, taints ...string) *corev1.Node {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name},
			Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: ready, Reason: "KubeletNotReady"}}}}
		for _, key := range taints {
			n.Spec.Taints = append(n.Spec.Taints, corev1.Taint{Key: key, Effect: corev1.TaintEffectNoSchedule})
		}
		return n
	}
	for _, tc := range []struct {
		name  string
		nodes []*corev1.Node
		want  string // in the error; "" for none
	}{
		{"ready", []*corev1.Node{node("node-1", corev1.ConditionTrue), node("node-2", corev1.ConditionTrue, "example.com/other")}, ""},
		{"one missing", []*corev1.Node{node("node-1", corev1.ConditionTrue)}, "1 nodes registered, want 2"},
		{"not ready", []*corev1.Node{node("node-1", corev1.ConditionTrue), node("node-2", corev1.ConditionFalse)}, "node node-2 is not Ready: KubeletNotReady"},
		{"ready, still tainted", []*corev1.Node{node("node-1", corev1.ConditionTrue, corev1.TaintNodeUnreachable), node("node-2", corev1.ConditionTrue)},
			"node node-1 is Ready but still tainted " + corev1.TaintNodeUnreachable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset()
			for _, n := range tc.nodes {
				if _, err := client.CoreV1().Nodes().Create(context.Background(), n, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			err := nodesReady(context.Background(), client, 2)
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("nodesReady: %v; want %q", err, tc.want)
			}
		})
	}
}
