from django.db import transaction
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, JsonResponse
from django.views.decorators.http import require_POST

from .jobs import send_receipt
from .models import Order


class OutOfStock(Exception):
    pass


@require_POST
def place_order(request: HttpRequest) -> HttpResponse:
    """Write the order and queue its receipt in one transaction: both are kept,
    or (the item is out of stock) neither is."""
    item = request.POST.get("item", "")
    if not item:
        return HttpResponseBadRequest("item is required")
    try:
        with transaction.atomic():
            order = Order.objects.create(item=item)
            job_id = send_receipt.dispatch(order.pk)
            if request.POST.get("stock") == "0":
                raise OutOfStock(item)
    except OutOfStock:
        return JsonResponse({"error": f"{item} is out of stock"}, status=409)
    return JsonResponse({"order": order.pk, "job": job_id}, status=201)
