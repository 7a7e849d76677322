"""The gRPC front end: formwork.v1.Generation, health and reflection. The only part of the service
that imports grpc and the generated stubs (service/_gen/); it maps formwork.v1 messages onto the
service's wire-neutral requests (service/request.py) and its errors onto gRPC statuses."""
