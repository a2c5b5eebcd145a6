"""The shop's jobs: found by rainier_sync.django in this installed app's jobs module."""

from rainier_sync import job


@job("orders.send-receipt", tries=3)
def send_receipt(order_id: int) -> None:
    """Confirm the order and write its receipt."""
    from .models import Order, Receipt

    order = Order.objects.get(pk=order_id)
    Receipt.objects.create(order=order, text=f"Thank you for your order of {order.item}")
    Order.objects.filter(pk=order_id).update(confirmed=True)
