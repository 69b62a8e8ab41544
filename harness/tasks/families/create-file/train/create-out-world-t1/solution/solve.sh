#!/bin/bash
echo world > /app/out.txt
