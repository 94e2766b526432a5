"""Generated protocol code (proto/specctl/v1) and the names the rest of specctl uses."""

from specctl.api.specctl.v1 import controller_pb2 as pb
from specctl.api.specctl.v1 import controller_pb2_grpc as pb_grpc

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["SpecController"].full_name
ADMIN_SERVICE_NAME = pb.DESCRIPTOR.services_by_name["SpecControllerAdmin"].full_name

__all__ = ["ADMIN_SERVICE_NAME", "SERVICE_NAME", "pb", "pb_grpc"]
