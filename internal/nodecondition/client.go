package nodecondition

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	"github.com/proxyhealth/proxyhealth/internal/corev1rest"
)

// API is what the publisher asks of the API server.
type API interface {
	GetNode(ctx context.Context, name string) (*corev1.Node, error)
	// PatchNodeStatus applies a strategic merge patch to the Node's status subresource.
	PatchNodeStatus(ctx context.Context, name string, patch []byte) error
	GetService(ctx context.Context, namespace, name string) (*corev1.Service, error)
	CreateEvent(ctx context.Context, ev *corev1.Event) error
}

// restAPI is API on the exporter's core/v1 client.
type restAPI struct{ *corev1rest.Client }

// NewAPI returns the API for cfg (the exporter's own connection settings).
func NewAPI(cfg *rest.Config) (API, error) {
	c, err := corev1rest.New(cfg)
	if err != nil {
		return nil, err
	}
	return restAPI{c}, nil
}

func (a restAPI) PatchNodeStatus(ctx context.Context, name string, patch []byte) error {
	return a.REST.Patch(types.StrategicMergePatchType).Resource("nodes").Name(name).SubResource("status").Body(patch).Do(ctx).Error()
}

func (a restAPI) GetService(ctx context.Context, namespace, name string) (*corev1.Service, error) {
	s := &corev1.Service{}
	err := a.REST.Get().Namespace(namespace).Resource("services").Name(name).Do(ctx).Into(s)
	return s, err
}

func (a restAPI) CreateEvent(ctx context.Context, ev *corev1.Event) error {
	return a.REST.Post().Namespace(ev.Namespace).Resource("events").VersionedParams(&metav1.CreateOptions{}, a.Params).Body(ev).Do(ctx).Error()
}
