package reportwriter

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/proxyhealth/proxyhealth/internal/corev1rest"
)

// API is what the writer asks of the API server.
type API interface {
	// GetNode reads the Node, for its UID: the report's owner.
	GetNode(ctx context.Context, name string) (*corev1.Node, error)
	UpdateConfigMap(ctx context.Context, cm *corev1.ConfigMap) error
	CreateConfigMap(ctx context.Context, cm *corev1.ConfigMap) error
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

func (a restAPI) UpdateConfigMap(ctx context.Context, cm *corev1.ConfigMap) error {
	return a.REST.Put().Namespace(cm.Namespace).Resource("configmaps").Name(cm.Name).
		VersionedParams(&metav1.UpdateOptions{}, a.Params).Body(cm).Do(ctx).Error()
}

func (a restAPI) CreateConfigMap(ctx context.Context, cm *corev1.ConfigMap) error {
	return a.REST.Post().Namespace(cm.Namespace).Resource("configmaps").
		VersionedParams(&metav1.CreateOptions{}, a.Params).Body(cm).Do(ctx).Error()
}
